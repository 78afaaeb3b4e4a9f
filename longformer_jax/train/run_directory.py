"""The run's directory: checked before anything is built, its `config.json` written last.

`config.json` records the settings a checkpoint was trained with (eval.py
reads the architecture from it), so it is written only once the config has
validated and the checkpoint (if any) has been restored, and atomically (a
temporary file renamed over the old one): a run that fails on an existing
workdir leaves that workdir's `config.json` as it was.
"""

import jax
import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths

CONFIG_FILE = 'config.json'


def check_workdir(workdir: str) -> None:
  """Raises `ConfigError('--workdir', ...)` when `workdir` is an existing file, or a `gs://`
  path whose bucket does not exist."""
  paths.check_bucket(workdir, '--workdir')
  path = paths.as_path(workdir)
  if path.exists() and not path.is_dir():
    raise ConfigError('--workdir', f'{workdir!r} is an existing file, not a directory; '
                      f'pass --workdir=DIR with a new or existing run directory')


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes `workdir/config.json` atomically (first process only)."""
  if jax.process_index() != 0:
    return
  paths.write_text_atomically(paths.as_path(workdir) / CONFIG_FILE,
                              config.to_json_best_effort(indent=2))

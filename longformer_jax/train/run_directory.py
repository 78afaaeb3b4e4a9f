"""The run's directory: checked before anything is built, its `config.json` written last.

`config.json` records the settings a checkpoint was trained with (eval.py
reads the architecture from it), so it is written only once the config has
validated and the checkpoint (if any) has been restored, and atomically (a
temporary file renamed over the old one): a run that fails on an existing
workdir leaves that workdir's `config.json` as it was.
"""

import os

import jax
import ml_collections

from longformer_jax.config.errors import ConfigError

CONFIG_FILE = 'config.json'


def check_workdir(workdir: str) -> None:
  """Raises `ConfigError('--workdir', ...)` when `workdir` exists and is not a directory."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError('--workdir', f'{workdir!r} is an existing file, not a directory; '
                      f'pass --workdir=DIR with a new or existing run directory')


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes `workdir/config.json` atomically (first process only)."""
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, CONFIG_FILE)
  temporary = f'{path}.tmp'
  with open(temporary, 'w') as f:
    f.write(config.to_json_best_effort(indent=2))
  os.replace(temporary, path)

"""The flags train.py and eval.py share: `--config` (with `--config.KEY=VALUE`) and `--workdir`."""

import os

from absl import flags
from ml_collections import config_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, 'configs', 'default.py')
DEFAULT_WORKDIR = 'workdirs/default'


def define_flags(workdir_help: str) -> None:
  """Defines the flags; called only when a script runs, so tests can import scripts."""
  config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'Experiment config file.')
  flags.DEFINE_string('workdir', DEFAULT_WORKDIR, workdir_help)

"""The command line of train.py and eval.py: config file, overrides, workdir, errors.

  python train.py [--config=configs/NAME.py] [--workdir=DIR] [--config.KEY=VALUE ...] [--debug]

`--config.KEY=VALUE` flags are taken out of the argument list before absl
parses the rest, applied to the file's sparse config and checked with it
(`experiment_config.resolve_config`): an unknown key names the closest valid
one. A bad setting, a missing file or a broken checkpoint ends the program
with one line on stderr and exit status 2 (`--debug` shows the traceback);
anything unexpected keeps its traceback. A storage failure (`StorageError`, status 75)
ends the process at once after its line (`os._exit`): threads still waiting on the failed
storage (Orbax's save threads, which are no daemons, and the operations
`checkpoint/storage_bound.py` abandoned) would otherwise hold the exit for as long as
their clients retry.
"""

import sys
import traceback
from typing import Callable

from absl import app, flags
import ml_collections

from longformer_jax.checkpoint.checkpointer import CheckpointNotFoundError, CorruptCheckpointError
from longformer_jax.checkpoint.resume_checks import CheckpointMismatchError
from longformer_jax.config.command_line_args import (DEFAULT_CONFIG, DEFAULT_WORKDIR,
                                                      split_config_overrides)
from longformer_jax.config.overrides import load_config_file, with_overrides
from longformer_jax.config.errors import ConfigError, UserError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.storage.storage_errors import StorageError, exit_abandoning_threads

USAGE_ERROR_STATUS = 2

_config_overrides: list = []


def define_flags(workdir_help: str) -> None:
  """Defines the flags; called only when a script runs, so tests can import scripts."""
  flags.DEFINE_string('config', DEFAULT_CONFIG, 'Experiment config file (configs/NAME.py).')
  flags.DEFINE_string('workdir', DEFAULT_WORKDIR, workdir_help)
  flags.DEFINE_bool('debug', False, 'Show the traceback of configuration and input errors.')


def experiment_config(config_path: str, overrides: list):
  """The checked, complete `ConfigDict` of a config file with command-line overrides."""
  values = with_overrides(load_config_file(config_path), overrides)
  return ml_collections.ConfigDict(resolve_config(values))


def flag_config():
  """The experiment config of this command line (`--config` and its overrides)."""
  return experiment_config(flags.FLAGS.config, _config_overrides)


def user_errors() -> tuple:
  """The exception types reported in one line (bad input, not bugs)."""
  return (ConfigError, UserError, FileNotFoundError, CheckpointNotFoundError,
          CorruptCheckpointError, CheckpointMismatchError, UnicodeDecodeError)


def report_and_exit(error: BaseException, debug: bool) -> None:
  """Prints `error` on one line (the traceback first with `--debug`) and exits with the
  error's `exit_status` (e.g. 73 for a workdir another run holds), else status 2."""
  if debug:
    traceback.print_exception(error)
  message = str(error).strip().replace('\n', ' ')
  print(f'error: {message}', file=sys.stderr)
  status = getattr(error, 'exit_status', USAGE_ERROR_STATUS)
  if isinstance(error, StorageError):
    exit_abandoning_threads(status)
  sys.exit(status)


def run(main: Callable[[list], None]) -> None:
  """`absl.app.run(main)` with `--config.K=V` overrides and one-line user errors."""
  global _config_overrides
  debug = '--debug' in sys.argv
  try:
    argv, _config_overrides = split_config_overrides(sys.argv)
  except ConfigError as error:
    report_and_exit(error, debug)

  def guarded(args):
    try:
      main(args)
    except user_errors() as error:  # pylint: disable=catching-non-exception
      report_and_exit(error, flags.FLAGS.debug)

  app.run(guarded, argv=argv)

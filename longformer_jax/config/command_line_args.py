"""The scripts' command line as text, before any flag library parses it (imports nothing
heavy, so `train.py` can read it before JAX loads: checkpoint/early_refusal.py).

  python train.py [--config=configs/NAME.py] [--workdir=DIR] [--config.KEY=VALUE ...]

`split_config_overrides` takes the `--config.KEY=VALUE` flags out of the arguments (absl
then parses the rest, command_line.py); `flag_value` reads one plain flag the way absl
does (`--name=value` or `--name value`, the last one winning).
"""

import os

from longformer_jax.config.errors import ConfigError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, 'configs', 'default.py')
DEFAULT_WORKDIR = 'workdirs/default'

_CONFIG_PREFIX = '--config.'


def split_config_overrides(argv: list) -> tuple:
  """`(argv without --config.K=V flags, [(K, V), ...])`; `--config.K V` is accepted too."""
  rest, overrides = [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith(_CONFIG_PREFIX):
      key, sep, value = arg[len(_CONFIG_PREFIX):].partition('=')
      if not sep:
        if i + 1 >= len(argv):
          raise ConfigError(arg, 'needs a value (--config.KEY=VALUE)')
        value = argv[i + 1]
        i += 1
      overrides.append((key, value))
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


def flag_value(argv: list, name: str, default: str) -> str:
  """The value of `--name=VALUE` or `--name VALUE` in `argv` (without its `--config.K=V`
  flags; the last one wins, as in absl), else `default`."""
  value = default
  for i, arg in enumerate(argv):
    for prefix in (f'--{name}=', f'-{name}='):
      if arg.startswith(prefix):
        value = arg[len(prefix):]
    if arg in (f'--{name}', f'-{name}') and i + 1 < len(argv):
      value = argv[i + 1]
  return value

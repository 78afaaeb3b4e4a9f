"""The exception types for bad input: `ConfigError` for configuration values, `UserError` else.

Every check of a user-facing setting raises `ConfigError` with the dotted
config key that is wrong (for example `model.lsh.num_buckets`), so the
one-line message (`config.model.lsh.num_buckets: 3 must be even and >= 2`)
says which `--config.KEY=VALUE` flag to change. A key that starts with `-`
is a command-line flag (`--workdir`) and is printed as it is.
"""


class ConfigError(ValueError):
  """A configuration value is invalid; `key` is its dotted config path."""

  def __init__(self, key: str, message: str):
    self.key = key
    self.message = message
    where = key if key.startswith('-') else f'config.{key}'
    super().__init__(f'{where}: {message}')


class UserError(Exception):
  """A problem the user can fix that is not a config key (a missing file, a workdir that is a
  file, a bad prompt): the scripts print it on one line and exit with status 2."""


def require(condition: bool, key: str, message: str) -> None:
  """Raises `ConfigError(key, message)` unless `condition` holds."""
  if not condition:
    raise ConfigError(key, message)

"""The one exception type for bad configuration values.

Every check of a user-facing setting raises `ConfigError` with the dotted
config key that is wrong (for example `model.attention`), so a researcher
reading the traceback knows which `--config.KEY=VALUE` flag to change.
"""


class ConfigError(ValueError):
  """A configuration value is invalid; `key` is its dotted config path."""

  def __init__(self, key: str, message: str):
    self.key = key
    super().__init__(f"config key '{key}': {message}")


def require(condition: bool, key: str, message: str) -> None:
  """Raises `ConfigError(key, message)` unless `condition` holds."""
  if not condition:
    raise ConfigError(key, message)

"""Sparse configs: loading a file from `configs/`, merging, and `--config.KEY=VALUE` overrides.

A file in `configs/` defines `get_config()` returning a nested dict (or an
`ml_collections.ConfigDict`) of only what differs from the sections'
defaults. Files build on each other with `merged(base, changes)`. Command-line
overrides are applied to that sparse dict as strings; the section that owns
a key parses the string by the key's type when the config is resolved
(`longformer_jax/experiment_config.py`), so an unknown key or a bad value is
reported there with the closest valid name.
"""

import ast
import copy
import importlib.util
import inspect
import os
from typing import Mapping

import ml_collections

from longformer_jax.config.errors import ConfigError

# Free mappings: their leaves are parsed here (the section only sees the dict).
_LITERAL_MAPPINGS = ('model.aux_loss_weights.',)


def merged(base: Mapping, changes: Mapping) -> dict:
  """A deep copy of `base` with `changes` merged in (nested mappings merge key by key)."""
  out = copy.deepcopy(_plain(base))
  for key, value in changes.items():
    if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
      out[key] = merged(out[key], value)
    else:
      out[key] = copy.deepcopy(_plain(value)) if isinstance(value, Mapping) else value
  return out


def _plain(values: Mapping) -> dict:
  if isinstance(values, ml_collections.ConfigDict):
    return values.to_dict()
  return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in values.items()}


def split_config_argument(spec: str) -> tuple[str, str | None]:
  """`'configs/x.py:a,b'` -> `('configs/x.py', 'a,b')`; `'configs/x.py'` -> `('configs/x.py', None)`."""
  path, colon, argument = spec.partition('.py:')
  if not colon:
    return spec, None
  return path + '.py', argument


def load_config_file(config_flag: str) -> dict:
  """The sparse config of `configs/NAME.py` (its `get_config()`) or `NAME.py:ARG` (`get_config(ARG)`)."""
  path, argument = split_config_argument(config_flag)
  if not os.path.isfile(path):
    raise ConfigError('--config', f'{path!r}: no such config file')
  module_spec = importlib.util.spec_from_file_location(
      f'_config_{os.path.splitext(os.path.basename(path))[0]}', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, 'get_config'):
    raise ConfigError('--config', f'{path!r} defines no get_config()')
  if argument is None:
    return _plain(module.get_config())
  if not inspect.signature(module.get_config).parameters:
    raise ConfigError('--config', f'{path!r} takes no argument after ":" (got {argument!r})')
  return _plain(module.get_config(argument))


def apply_override(config: dict, dotted_key: str, text: str) -> None:
  """Sets `config[a][b][c] = text` for `--config.a.b.c=text` (creating sections)."""
  parts = dotted_key.split('.')
  if not all(parts):
    raise ConfigError('--config.' + dotted_key, 'is not a dotted key (--config.section.key=value)')
  node = config
  for depth, part in enumerate(parts[:-1]):
    child = node.get(part)
    if child is None:
      child = node[part] = {}
    if not isinstance(child, dict):
      where = '.'.join(parts[:depth + 1])
      raise ConfigError(where, f'is a value ({child!r}), not a section: cannot set {dotted_key}')
    node = child
  value = text
  if any(dotted_key.startswith(prefix) for prefix in _LITERAL_MAPPINGS):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
  node[parts[-1]] = value


def with_overrides(config: Mapping, overrides: list) -> dict:
  """`config` with each `(dotted_key, text)` applied in order."""
  out = merged(config, {})
  for key, text in overrides:
    apply_override(out, key, text)
  return out

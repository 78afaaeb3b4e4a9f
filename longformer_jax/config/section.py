"""Typed config sections: a frozen dataclass per module, its defaults and its rules.

Every module that reads configuration declares one section next to its code:

  @dataclasses.dataclass(frozen=True)
  class LSHConfig(Section):
    num_buckets: int = 8     # buckets per hash round
    num_hashes: int = 2

    def validate(self, env):
      self.require(self.num_buckets >= 2 and self.num_buckets % 2 == 0, 'num_buckets',
                   'must be even and >= 2')

`LSHConfig.build(values, 'model.lsh', env)` turns a mapping (from a config
file, the command line or an old run's `config.json`) into a checked
instance. An unknown key names the closest valid one; a value of the wrong
type or one that breaks a rule names the key, the value and the rule, in one
line (`ConfigError`). Command-line strings are parsed by the field's type.

Fields are plain values (int, float, bool, str, tuples of them) or nested
sections; a field typed `dict` holds a free mapping that its section checks,
frozen (`config/frozen_mapping.FrozenMapping`) so that every section hashes
and can be a field of a Flax module (`models/resolved_model.py`).
A `config.json` written before the sections existed still loads: its old
flat names move to their sections in `longformer_jax/config/migration.py`.
"""

import ast
import dataclasses
import difflib
import typing
from typing import Any, Mapping

from longformer_jax.config.errors import ConfigError
from longformer_jax.config.frozen_mapping import FrozenMapping, freeze, thaw

_BOOL_WORDS = {'true': True, 'false': False, '1': True, '0': False, 'yes': True, 'no': False}


def closest_name(name: str, choices) -> str:
  """'; did you mean X?' for the choice nearest to `name` (or '' if none is near)."""
  match = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
  return f'; did you mean {match[0]}?' if match else ''


def unknown_key_error(path: str, key: str, choices) -> ConfigError:
  return ConfigError(f'{path}.{key}' if path else key,
                     f'unknown key{closest_name(key, choices)}')


class FieldError(Exception):
  """Raised by `Section.require`; `build` turns it into a `ConfigError` with the full path."""

  def __init__(self, name: str, rule: str):
    super().__init__(name, rule)
    self.name = name
    self.rule = rule


class Section:
  """Mixin for frozen dataclasses that are config sections (see the module docstring)."""

  def __post_init__(self) -> None:
    """Mappings (the fields typed `dict`) are held frozen, so that the section hashes."""
    for name in self.field_names():
      value = getattr(self, name)
      if isinstance(value, Mapping) and not isinstance(value, FrozenMapping):
        object.__setattr__(self, name, freeze(value))

  def validate(self, env: Any) -> None:
    """Checks rules across fields (and against `env`, what the section lives in)."""
    del env

  def require(self, condition: bool, name: str, rule: str) -> None:
    """Fails the field `name` with `rule` unless `condition` holds."""
    if not condition:
      raise FieldError(name, rule)

  @classmethod
  def field_names(cls) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))

  @classmethod
  def field_type(cls, name: str):
    return typing.get_type_hints(cls)[name]

  @classmethod
  def defaults(cls) -> 'Section':
    return cls()

  @classmethod
  def build(cls, values: Mapping | None, path: str, env: Any = None) -> 'Section':
    """A checked instance from `values` (missing keys take their defaults)."""
    # A section arrives as a mapping or a ConfigDict (no Mapping, so it is not tested for);
    # a scalar or a list (`--config.data.listops=3`) is a value where keys belong.
    if isinstance(values, (str, bytes, int, float, list, tuple)):
      raise ConfigError(path, f'is a section of keys, not a value (got {values!r}); '
                        f'set its keys, e.g. {path}.KEY=VALUE')
    values = dict(values or {})
    names = cls.field_names()
    for key in values:
      if key not in names:
        raise unknown_key_error(path, key, names)
    kwargs = {}
    for name in names:
      if name not in values:
        continue
      kind = cls.field_type(name)
      key = f'{path}.{name}'
      if isinstance(kind, type) and issubclass(kind, Section):
        kwargs[name] = kind.build(values[name], key, env)
      else:
        kwargs[name] = coerce(values[name], kind, key)
    instance = cls(**kwargs)
    try:
      instance.validate(env)
    except FieldError as error:
      value = getattr(instance, error.name, None)
      raise ConfigError(f'{path}.{error.name}', f'{value!r} {error.rule}') from None
    return instance

  @classmethod
  def of(cls, values, path: str = 'model') -> 'Section':
    """The section whose fields a wider, resolved mapping holds among its keys.

    A section whose fields another section inherits (the model settings inherit the
    feed-forward's and the norms', keeping their flat keys) is read back from a layer's
    resolved config this way: every field must be there (no default applies), checked again.
    `values` is a mapping or an object with the fields as attributes (a resolved model,
    `models/resolved_model.py`).
    """
    if dataclasses.is_dataclass(values):
      return cls.build({name: getattr(values, name) for name in cls.field_names()}, path)
    return cls.build({name: values[name] for name in cls.field_names()}, path)

  def to_dict(self) -> dict:
    """Plain nested dict of the values (tuples stay tuples, frozen mappings become dicts)."""
    out = {}
    for name in self.field_names():
      value = getattr(self, name)
      out[name] = value.to_dict() if isinstance(value, Section) else thaw(value)
    return out

  def changed(self) -> dict:
    """The fields whose values differ from the defaults, `{name: value}`."""
    default = type(self)()
    return {name: getattr(self, name) for name in self.field_names()
            if getattr(self, name) != getattr(default, name)}


def _type_name(kind) -> str:
  return getattr(kind, '__name__', str(kind))


def coerce(value: Any, kind, key: str) -> Any:
  """`value` as the field type `kind`; strings (command line) are parsed.

  int fields take ints (and integral floats from JSON), float fields take
  ints and floats, bool fields take bools (and true/false strings), tuple
  fields take lists and tuples. Anything else is a `ConfigError` naming `key`.
  """
  origin = typing.get_origin(kind)
  if kind is Any:
    return value
  if kind is bool:
    if isinstance(value, str) and value.lower() in _BOOL_WORDS:
      return _BOOL_WORDS[value.lower()]
    if isinstance(value, bool):
      return value
  elif kind is int:
    if isinstance(value, str):
      value = _literal(value)
    if isinstance(value, int) and not isinstance(value, bool):
      return int(value)
    if isinstance(value, float) and value.is_integer():
      return int(value)
  elif kind is float:
    if isinstance(value, str):
      value = _literal(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
  elif kind is str:
    if isinstance(value, str):
      return value
  elif kind is tuple or origin is tuple:
    if isinstance(value, str):
      value = _literal(value)
    if isinstance(value, (list, tuple)):
      return _deep_tuple(value)
  elif kind is dict or origin is dict:
    if value is None:
      return {}
    if isinstance(value, Mapping):
      return _plain_dict(value)
  else:
    raise TypeError(f'{key}: unsupported field type {kind!r}')
  name = _type_name(origin or kind)
  raise ConfigError(key, f"{value!r} is not {'an' if name[0] in 'aeiou' else 'a'} {name}")


def _deep_tuple(value):
  if isinstance(value, (list, tuple)):
    return tuple(_deep_tuple(v) for v in value)
  return value


def _literal(text: str):
  try:
    return ast.literal_eval(text.strip())
  except (ValueError, SyntaxError):
    return text


def _plain_dict(value: Mapping) -> dict:
  return {k: _plain_dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}

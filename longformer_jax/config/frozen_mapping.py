"""An immutable, hashable mapping: how a section holds a field typed `dict`.

A config section is a frozen dataclass, and the model's resolved sections are
fields of Flax modules, which must hash. A free mapping such as
`model.layer_schedule` or `model.aux_loss_weights` is therefore held as a
`FrozenMapping`: its items in their order (nested mappings frozen too, lists
held as tuples that remember they were lists), read like a dict (`m['key']`,
`m.get`, `m.items()`, `dict(m)`), equal to a dict with the same items, and
turned back into the plain dicts and lists it was made from by `thaw`
(`Section.to_dict`, for `config.json`).
"""

from typing import Any, Iterator, Mapping


class FrozenMapping(Mapping):
  """A read-only mapping that hashes; equal to any mapping with the same items."""

  __slots__ = ('_items', '_index')

  def __init__(self, values: Mapping | None = None):
    items = tuple((key, freeze(value)) for key, value in dict(values or {}).items())
    object.__setattr__(self, '_items', items)
    object.__setattr__(self, '_index', dict(items))

  def __setattr__(self, name, value):
    raise AttributeError(f'FrozenMapping is immutable (setting {name!r})')

  def __getitem__(self, key) -> Any:
    return self._index[key]

  def __iter__(self) -> Iterator:
    return (key for key, _ in self._items)

  def __len__(self) -> int:
    return len(self._items)

  def __hash__(self) -> int:
    return hash(frozenset(self._items))

  def __eq__(self, other) -> bool:
    if isinstance(other, Mapping):
      return thaw(self) == thaw(other)
    return NotImplemented

  def __repr__(self) -> str:
    return f'FrozenMapping({self._index!r})'

  def __reduce__(self):
    return FrozenMapping, (thaw(self),)


class FrozenList(tuple):
  """A list held frozen in a `FrozenMapping`: a tuple that `thaw` makes a list again."""

  __slots__ = ()

  def __repr__(self) -> str:
    return f'FrozenList({list(self)!r})'


def freeze(value: Any) -> Any:
  """`value` with every mapping a `FrozenMapping` and every list a `FrozenList` (recursively)."""
  if isinstance(value, FrozenMapping):
    return value
  if isinstance(value, Mapping) or hasattr(value, 'to_dict') and hasattr(value, 'keys'):
    return FrozenMapping(value.to_dict() if hasattr(value, 'to_dict') else value)
  if isinstance(value, list):
    return FrozenList(freeze(v) for v in value)
  if isinstance(value, tuple) and not isinstance(value, FrozenList):
    return tuple(freeze(v) for v in value)
  return value


def thaw(value: Any) -> Any:
  """The inverse of `freeze`: plain nested dicts and lists (tuples stay tuples)."""
  if isinstance(value, Mapping):
    return {key: thaw(v) for key, v in value.items()}
  if isinstance(value, (FrozenList, list)):
    return [thaw(v) for v in value]
  if isinstance(value, tuple):
    return tuple(thaw(v) for v in value)
  return value

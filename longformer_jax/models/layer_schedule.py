"""Per-layer settings: `model.layer_schedule` resolved into one config per layer.

`model.layer_schedule` mirrors the model config: a leaf gives one value per
layer, as a comma-separated string (`'64,64,128,256'`) or a tuple, for the
shared setting or section key at the same path:

  layer_schedule = {'attention': 'xl,xl,memorizing,xl'}        # kNN memory in layer 2
  layer_schedule = {'longformer': {'window': '16,32,64,128'}}  # windows grow with depth

Layer i is built from `layer_config(model, i)`: the resolved model
(`models/resolved_model.py`) with each scheduled value replaced by its i-th item
(typed like the field it sets), and `layer_index = i` (BigBird seeds its random
blocks with it). A schedule needs
`scan_layers=False`; `models/model_config.py` checks every layer's values.
"""

import copy
import dataclasses
from typing import Callable, Mapping

from longformer_jax.config.errors import ConfigError
from longformer_jax.config.frozen_mapping import FrozenMapping
from longformer_jax.config.section import coerce, unknown_key_error

# Settings that fix the shape of the whole stack cannot differ by layer.
NOT_SCHEDULABLE = ('num_layers', 'scan_layers', 'layer_schedule', 'stack', 'block', 'dtype',
                   'd_model', 'vocab_multiple', 'tie_embeddings', 'aux_loss_weights',
                   'num_classes', 'decoder_layers', 'remat_policy', 'position_embedding',
                   'max_positions', 'decoder_max_positions', 'embedding_norm', 'logits_bias',
                   'scale_tied_logits')


def leaves(schedule: Mapping, prefix: tuple = ()) -> list:
  """`[(path tuple, raw per-layer value)]` of a (nested) schedule."""
  out = []
  for key, value in schedule.items():
    if isinstance(value, Mapping):
      out.extend(leaves(value, prefix + (key,)))
    else:
      out.append((prefix + (key,), value))
  return out


def check_paths(schedule: Mapping, common_names, sections: Mapping, path: str) -> None:
  """Every leaf names a shared setting or a `section.key` that may differ by layer."""
  for key, value in schedule.items():
    where = f'{path}.layer_schedule'
    if isinstance(value, Mapping):
      if key not in sections:
        raise unknown_key_error(where, key, sections)
      for name in value:
        if isinstance(value[name], Mapping) or name not in sections[key].field_names():
          raise unknown_key_error(f'{where}.{key}', name, sections[key].field_names())
    elif key in sections:
      raise ConfigError(f'{where}.{key}', f'{value!r}: schedule the keys of the section, '
                        f'e.g. {where}.{key}.<key> = "a,b,..."')
    elif key not in common_names:
      raise unknown_key_error(where, key, tuple(common_names) + tuple(sections))
    elif key in NOT_SCHEDULABLE:
      raise ConfigError(f'{where}.{key}', f'{value!r}: {key} is the same for every layer')


def items_of(raw, num_layers: int, key: str) -> list[str]:
  """The per-layer items of one leaf, as strings; exactly `num_layers` of them."""
  items = raw.split(',') if isinstance(raw, str) else list(raw)
  if len(items) != num_layers:
    raise ConfigError(key, f'{raw!r} needs one value per layer ({num_layers}), got {len(items)}')
  return [str(item).strip() for item in items]


def apply(values: Mapping, schedule: Mapping, index: int, num_layers: int, path: str,
          field_type: Callable[[tuple], object]) -> dict:
  """`values` (a model mapping) with every scheduled leaf set to its item `index`."""
  out = copy.deepcopy(dict(values))
  for parts, raw in leaves(schedule):
    key = f'{path}.layer_schedule.' + '.'.join(parts)
    kind = field_type(parts)
    item = items_of(raw, num_layers, key)[index]
    value = coerce(item, kind, key) if kind is not None else item
    node = out
    for part in parts[:-1]:
      node[part] = dict(node.get(part) or {})
      node = node[part]
    node[parts[-1]] = value
  return out


def layer_config(config, index: int):
  """The resolved model of layer `index` (scheduled values set, `layer_index = index`).

  `config` is a `ResolvedModel` (models/resolved_model.py): each scheduled item is
  typed like the field it sets, in the shared settings or in its section.
  """
  if not dataclasses.is_dataclass(config):
    raise TypeError(f'layer_config takes a ResolvedModel (models/resolved_model.py), '
                    f'not a {type(config).__name__}')
  changes, sections = {}, dict(config.sections)
  for parts, raw in leaves(config.layer_schedule):
    key = 'model.layer_schedule.' + '.'.join(parts)
    item = items_of(raw, config.num_layers, key)[index]
    if len(parts) == 1:
      changes[parts[0]] = coerce(item, type(config).field_type(parts[0]), key)
    else:
      name, field = parts
      value = coerce(item, type(sections[name]).field_type(field), key)
      sections[name] = dataclasses.replace(sections[name], **{field: value})
  return dataclasses.replace(config, layer_schedule=FrozenMapping(), layer_index=index,
                             sections=FrozenMapping(sections), **changes)


def has_schedule(config) -> bool:
  return bool(config.layer_schedule)

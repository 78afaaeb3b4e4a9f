"""Per-layer settings: `model.layer_schedule` resolved into one config per layer.

`config.layer_schedule` maps a model key to one value per layer, as a
comma-separated string (`'64,64,128,256'`) or a tuple. Layer i is built from
`layer_config(config, i)`: the model config with each scheduled key set to
its i-th value. Values are converted to the type of the key's default in the
model config (int, float, bool or str); keys the model config lacks are read
as int, then float, then str. Examples: Longformer windows growing with
depth, which layers have kNN memory (`attention = 'xl,xl,memorizing,xl'`),
Sparse Transformer patterns alternating by layer.
"""

import ml_collections

from longformer_jax.config_errors import ConfigError

_BOOLS = {'true': True, 'false': False, '1': True, '0': False}


def _parse_item(text: str, like, key: str):
  text = text.strip()
  if isinstance(like, bool):
    if text.lower() not in _BOOLS:
      raise ConfigError(key, f'expected true/false per layer, got {text!r}')
    return _BOOLS[text.lower()]
  if isinstance(like, (int, float)) and not isinstance(like, bool):
    try:
      return type(like)(float(text) if isinstance(like, float) else int(text))
    except ValueError:
      raise ConfigError(key, f'expected a {type(like).__name__} per layer, got {text!r}') from None
  if isinstance(like, str):
    return text
  for convert in (int, float):
    try:
      return convert(text)
    except ValueError:
      pass
  return text


def scheduled_values(config, name: str) -> list:
  """Layer-by-layer values of `config.layer_schedule[name]`, typed like `config[name]`."""
  key = f'model.layer_schedule.{name}'
  raw = config.layer_schedule[name]
  items = raw.split(',') if isinstance(raw, str) else list(raw)
  if len(items) != config.num_layers:
    raise ConfigError(key, f'needs one value per layer ({config.num_layers}), got {len(items)}: {raw!r}')
  like = config.get(name, None)
  return [_parse_item(str(item), like, key) for item in items]


def has_schedule(config) -> bool:
  return bool(config.get('layer_schedule', None)) and len(config.layer_schedule) > 0


def layer_config(config, index: int) -> ml_collections.FrozenConfigDict:
  """The model config of layer `index`: scheduled keys replaced by their i-th value,
  and `layer_index = index` (e.g. BigBird seeds its random blocks with it)."""
  values = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  if has_schedule(config):
    for name in config.layer_schedule.keys():
      values[name] = scheduled_values(config, name)[index]
  values['layer_schedule'] = {}
  values['layer_index'] = index
  return ml_collections.FrozenConfigDict(values)


def validate_schedule(config) -> None:
  """Every scheduled key has one well-typed value per layer; not with `scan_layers`."""
  if not has_schedule(config):
    return
  if config.scan_layers:
    raise ConfigError('model.scan_layers',
                      'a layer_schedule makes layers differ; it needs scan_layers=False')
  for name in config.layer_schedule.keys():
    scheduled_values(config, name)

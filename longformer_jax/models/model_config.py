"""`config.model`: the shared model settings plus one section per variant, block and stack.

  model:
    attention: 'longformer'      # any name in attention/registry.py
    num_layers: 4, d_model: 256, ...
    longformer: {window: 64, ...}    # the section of each attention variant,
    gtrxl: {gate: 'gru', ...}        # block kind (models/block_registry.py)
    universal_act: {max_steps: 4}    # and stack kind (models/stack_registry.py)
    layer_schedule: {attention: 'xl,xl,memorizing,xl', longformer: {window: '16,32,64,128'}}

The shared settings themselves, their defaults and rules, are `ModelConfig`
(models/model_settings.py). `resolve_model(values, path, env)` checks a (possibly sparse)
mapping and returns the complete plain dict that `config.json` stores: every section
present, with its defaults where not set (`models/resolved_model.py` turns it into the
typed, frozen object the Flax modules take). The checks: unknown keys (with the closest
name), every value by the section that owns it, the block and stack names against their
registries, every layer of a schedule (`models/layer_schedule.py`), and that nothing set is
ignored: a section of a variant no layer uses, or `mem_len` when no layer's variant keeps a
cache.
"""

import dataclasses
from typing import Any, Mapping

from longformer_jax.attention.core import attention_backend
from longformer_jax.attention.registry import ATTENTION_VARIANTS
from longformer_jax.config.section import Section, unknown_key_error
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.migration import moved_key
from longformer_jax.models import layer_schedule
from longformer_jax.models.block_registry import BLOCK_TYPES
from longformer_jax.models.model_settings import ModelConfig, ModelEnv
from longformer_jax.models.stack_registry import STACK_TYPES


def section_classes() -> dict:
  """Section name -> its `Section` class, for every registered variant, block and stack."""
  sections = {}
  for registry in (ATTENTION_VARIANTS, BLOCK_TYPES, STACK_TYPES):
    for name, cls in registry.items():
      sections[name] = getattr(cls, 'Config', None) or _EMPTY
  return sections


@dataclasses.dataclass(frozen=True)
class _NoSettings(Section):
  """The section of a variant that has no settings of its own."""


_EMPTY = _NoSettings


def _reads_mem_len(attention: str) -> bool:
  return bool(getattr(ATTENTION_VARIANTS[attention], 'reads_mem_len', False))


def resolve_model(values: Mapping | None, path: str = 'model', chunk_lens: tuple = ()) -> dict:
  """The complete, checked `config.model` dict from a (possibly sparse) mapping."""
  values = dict(values or {})
  sections = section_classes()
  common_names = ModelConfig.field_names()
  for key in values:
    if key not in common_names and key not in sections:
      moved = moved_key(key, (values.get('attention', ModelConfig.attention),
                              values.get('block', ModelConfig.block),
                              values.get('stack', ModelConfig.stack)))
      if moved:
        raise ConfigError(f'{path}.{key}', f'unknown key; it is now {path}.{moved}')
      raise unknown_key_error(path, key, tuple(common_names) + tuple(sections))
  common_values = {k: v for k, v in values.items() if k in common_names}
  _check_kinds(common_values, path)
  common = ModelConfig.build(common_values, path)
  layer_schedule.check_paths(common.layer_schedule, common_names, sections, path)
  if common.position_embedding == 'learned' and chunk_lens and max(chunk_lens) > common.max_positions:
    raise ConfigError(f'{path}.max_positions',
                      f'{common.max_positions} rows of learned positions, but chunks of '
                      f'{max(chunk_lens)} tokens are read; keep every chunk length <= '
                      f'{common.max_positions} (learned positions restart in each chunk)')
  if common.layer_schedule and common.scan_layers:
    raise ConfigError(f'{path}.scan_layers',
                      'True, but a layer_schedule makes layers differ; it needs scan_layers=False')

  used = {common.block, common.stack}
  mem_len_read = False
  for index in range(common.num_layers):
    layer_values = layer_schedule.apply(values, common.layer_schedule, index, common.num_layers,
                                        path, _field_type_of(common_names, sections))
    layer_common = {k: v for k, v in layer_values.items() if k in common_names}
    _check_kinds(layer_common, path)
    layer = ModelConfig.build(layer_common, path)
    env = ModelEnv(model=layer, layer_index=index, chunk_lens=tuple(chunk_lens))
    used.add(layer.attention)
    mem_len_read |= _reads_mem_len(layer.attention)
    built = {name: sections[name].build(layer_values.get(name), f'{path}.{name}', env)
             for name in (layer.attention, layer.block, layer.stack)}
    _check_attention_backend(layer, built[layer.attention])

  resolved = common.to_dict()
  for name, cls in sections.items():
    given = values.get(name)
    if name not in used:
      _check_ignored(cls, given, f'{path}.{name}', common)
      resolved[name] = cls().to_dict()
    else:
      env = ModelEnv(model=common, chunk_lens=tuple(chunk_lens))
      resolved[name] = cls.build(given, f'{path}.{name}', env).to_dict()
  if common.mem_len and not mem_len_read:
    raise ConfigError(f'{path}.mem_len',
                      f'{common.mem_len} is ignored: no layer\'s attention keeps a cache of '
                      f'past hidden states (attention {describe_attention(common)}); set it to 0')
  return resolved


def _check_kinds(common_values: Mapping, path: str) -> None:
  """`model.block` and `model.stack` name a registered kind (before the shared settings are
  built, whose rules read the block: `ModelConfig` imports no registry of the model floor)."""
  for key, registry, kind in (('block', BLOCK_TYPES, 'block kind'),
                              ('stack', STACK_TYPES, 'stack kind')):
    value = common_values.get(key, getattr(ModelConfig, key))
    if isinstance(value, str) and value not in registry:
      raise ConfigError(f'{path}.{key}',
                        f'{value!r} is not a {kind}; choose one of {sorted(registry)}')


def _check_attention_backend(layer: ModelConfig, section) -> None:
  """`model.attention_backend` against what the layer's variant can run on a kernel."""
  pattern_of = getattr(ATTENTION_VARIANTS[layer.attention], 'kernel_pattern', None)
  attention_backend.check_layer(
      layer.attention_backend, pattern_of and pattern_of(layer, section), layer.attention,
      dtype=layer.dtype, head_dim=layer.head_dim)


def _check_ignored(cls, given, path: str, common: ModelConfig) -> None:
  """A section nobody reads must hold only its defaults."""
  if not given:
    return
  names = cls.field_names()
  defaults = cls()
  for key, value in dict(given).items():
    if key not in names:
      raise unknown_key_error(path, key, names)
    if value != getattr(defaults, key):
      raise ConfigError(f'{path}.{key}', f'{value!r} is ignored: no layer uses it (attention '
                        f'{describe_attention(common)}, block {common.block!r}, '
                        f'stack {common.stack!r})')


def describe_attention(common: ModelConfig) -> str:
  scheduled = common.layer_schedule.get('attention')
  return repr(scheduled) if scheduled else repr(common.attention)


def _field_type_of(common_names, sections):
  def field_type(parts: tuple):
    if len(parts) == 1 and parts[0] in common_names:
      return ModelConfig.field_type(parts[0])
    if len(parts) == 2 and parts[0] in sections and parts[1] in sections[parts[0]].field_names():
      return sections[parts[0]].field_type(parts[1])
    return None
  return field_type


def field_defaults() -> dict[str, Any]:
  """The defaults of the shared settings (for docs and tests)."""
  return ModelConfig().to_dict()

"""Attention variants by config name (`model.attention`).

A new variant is one file in this folder (or a folder, with the kernels only it uses) plus one
line here.
"""

import jax.numpy as jnp

from longformer_jax.attention.adaptive_span import AdaptiveSpanAttention
from longformer_jax.attention.attendre import AttendreAttention
from longformer_jax.attention.bigbird.attention import BigBirdAttention
from longformer_jax.attention.blockbert import BlockBERTAttention
from longformer_jax.attention.bp_transformer import BPTransformerAttention
from longformer_jax.attention.compressive import CompressiveAttention
from longformer_jax.attention.etc import ETCAttention
from longformer_jax.attention.expire_span import ExpireSpanAttention
from longformer_jax.attention.image_local.attention import ImageLocalAttention
from longformer_jax.attention.longformer.attention import LongformerAttention
from longformer_jax.attention.lsh.attention import LSHAttention
from longformer_jax.attention.memorizing import MemorizingAttention
from longformer_jax.attention.performer.attention import PerformerAttention
from longformer_jax.attention.routing.attention import RoutingAttention
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.sparse_transformer.attention import SparseTransformerAttention
from longformer_jax.attention.streaming_sinks import StreamingSinkAttention
from longformer_jax.attention.vanilla.attention import VanillaAttention
from longformer_jax.attention.xl import XLAttention
from longformer_jax.config.errors import ConfigError

ATTENTION_VARIANTS = {
    'adaptive_span': AdaptiveSpanAttention,
    'attendre': AttendreAttention,
    'bigbird': BigBirdAttention,
    'blockbert': BlockBERTAttention,
    'bp_transformer': BPTransformerAttention,
    'compressive': CompressiveAttention,
    'etc': ETCAttention,
    'expire_span': ExpireSpanAttention,
    'image_local': ImageLocalAttention,
    'longformer': LongformerAttention,
    'lsh': LSHAttention,
    'memorizing': MemorizingAttention,
    'performer': PerformerAttention,
    'routing': RoutingAttention,
    'sparse_transformer': SparseTransformerAttention,
    'streaming_sinks': StreamingSinkAttention,
    'vanilla': VanillaAttention,
    'xl': XLAttention,
}


def attention_class(name: str):
  """The module class registered as `name`; unknown names name the config key."""
  if name not in ATTENTION_VARIANTS:
    raise ConfigError('model.attention',
                      f'unknown attention {name!r}; choose one of {sorted(ATTENTION_VARIANTS)}')
  return ATTENTION_VARIANTS[name]


def section_of(cls, layer):
  """The section `cls` (a registered variant class) reads from `layer`, or None for a variant
  without one (vanilla).

  `layer` is one layer's model config as the model floor resolves it: the shared settings
  as attributes (`layer.attention`, `layer.num_heads`, ...), each variant's typed section by
  its key (`layer.longformer`) and `layer.layer_index`.
  """
  section_class = getattr(cls, 'Config', None)
  if section_class is None:
    return None
  section = getattr(layer, layer.attention)
  if not isinstance(section, section_class):
    raise TypeError(f'model.{layer.attention}: a layer\'s attention reads a '
                    f'{section_class.__name__}, not a {type(section).__name__} (pass the '
                    f'layer\'s resolved model config)')
  return section


def attention_layer(layer, dtype, name: str = 'attention'):
  """The attention module of `layer` (one layer's resolved model config, `section_of`): its
  variant's section and the shared settings (attention/shared_settings.py)."""
  cls = attention_class(layer.attention)
  kwargs = {}
  section = section_of(cls, layer)
  if section is not None:
    kwargs['config'] = section
  if 'layer_index' in cls.__dataclass_fields__:
    # Not a setting: the layer's number in its stack (BigBird seeds its random blocks with it).
    kwargs['layer_index'] = layer.layer_index
  return cls(shared=SharedSettings.of(layer), dtype=dtype, name=name, **kwargs)


def attention_state(layer, batch_size: int, dtype=jnp.float32):
  """The empty memory of `layer`'s attention (one layer's resolved model config,
  `section_of`): its variant's `init_state(section, shared, batch_size, dtype)`, a pytree of
  `[batch_size, ...]` arrays (`{}` for a stateless variant)."""
  cls = attention_class(layer.attention)
  return cls.init_state(section_of(cls, layer), SharedSettings.of(layer), batch_size, dtype)

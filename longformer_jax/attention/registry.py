"""Attention variants by config name (`model.attention`).

A new variant is one file in this folder (or a folder, with the kernels only it uses) plus one
line here.
"""

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


def attention_layer(config, dtype, name: str = 'attention'):
  """The attention module of a layer whose resolved model (models/resolved_model.py) is
  `config`: its variant's section (`config.<variant>`, already typed) and the shared
  settings (attention/shared_settings.py)."""
  cls = attention_class(config.attention)
  kwargs = {}
  section_class = getattr(cls, 'Config', None)
  if section_class is not None:
    section = getattr(config, config.attention)
    if not isinstance(section, section_class):
      raise TypeError(f'attention_layer takes a resolved model (models/resolved_model.py) whose '
                      f'{config.attention!r} is a {section_class.__name__}, not a '
                      f'{type(section).__name__}')
    kwargs['config'] = section
  if 'layer_index' in cls.__dataclass_fields__:
    # Not a setting: the layer's number in its stack (BigBird seeds its random blocks with it).
    kwargs['layer_index'] = config.layer_index
  return cls(shared=SharedSettings.of(config), dtype=dtype, name=name, **kwargs)

"""Attention variants by config name (`model.attention`).

A new variant is one file in this folder plus one line here.
"""

from longformer_jax.attention.vanilla import VanillaAttention
from longformer_jax.attention.xl import XLAttention
from longformer_jax.config_errors import ConfigError

ATTENTION_VARIANTS = {
    'vanilla': VanillaAttention,
    'xl': XLAttention,
}


def attention_class(name: str):
  """The module class registered as `name`; unknown names name the config key."""
  if name not in ATTENTION_VARIANTS:
    raise ConfigError('model.attention',
                      f'unknown attention {name!r}; choose one of {sorted(ATTENTION_VARIANTS)}')
  return ATTENTION_VARIANTS[name]

"""Residual block types by config name (`model.block`).

A block is `Block(config, dtype, name=...)(x, state, ctx) -> (x, (state, aux))`
with `x [batch, chunk, d_model]`; the stack builds one per layer.
"""

from longformer_jax.config.errors import ConfigError
from longformer_jax.models.pre_ln_block import DecoderBlock
from longformer_jax.models.gtrxl_block import GatedBlock
from longformer_jax.models.post_ln_block import PostLNBlock

BLOCK_TYPES = {
    'pre_ln': DecoderBlock,
    'gtrxl': GatedBlock,
    'post_ln': PostLNBlock,
}


def block_class(name: str):
  if name not in BLOCK_TYPES:
    raise ConfigError('model.block', f'unknown block {name!r}; choose one of {sorted(BLOCK_TYPES)}')
  return BLOCK_TYPES[name]

"""The pre-LN transformer block: x + Attn(LN(x)), then + FFN(LN(.)).

The norm is LayerNorm or RMSNorm (`model.norm`, `model.norm_epsilon`).
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer
from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.layers.norms import NormConfig, norm_layer

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


class DecoderBlock(nn.Module):
  """One block; the signature `(x, state, ctx) -> (x, (state, aux))` suits `nn.scan`.

  Shapes: `x [batch, chunk, d_model]`; `state` the attention variant's memory
  for this layer; `aux` a dict of the variant's auxiliary values.
  """
  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    cfg = self.config
    norm = NormConfig.of(cfg)
    attention = attention_layer(cfg, self.dtype)
    h, state, aux = attention(norm_layer(norm, 'attention_norm', self.dtype)(x), state, ctx)
    x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    feed_forward = FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate,
                               self.dtype, name='feed_forward')
    h = feed_forward(norm_layer(norm, 'feed_forward_norm', self.dtype)(x),
                     deterministic=ctx.deterministic)
    x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x, (state, aux)

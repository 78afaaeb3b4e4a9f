"""The post-LN transformer block of BERT and RoBERTa (Vaswani et al., 2017; Devlin et al., 2019).

    x = LN(x + Attn(x));   x = LN(x + FFN(x))

The norm follows each residual sum, so the block's output is already
normalised and a model built from these blocks has no final norm
(`models/encoder.py`, `models/decoder_lm.py`). Imported Longformer checkpoints
use it (`convert/longformer.py`); the norm is `model.norm` with
`model.norm_epsilon`, as in the pre-LN block.
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


class PostLNBlock(nn.Module):
  """`(x [batch, chunk, d_model], state, ctx) -> (x, (state, aux))`, as `DecoderBlock`.

  Parameter scopes: `attention`, `attention_norm` (after the attention's
  residual sum), `feed_forward`, `feed_forward_norm` (after the feed-forward's).
  """
  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    cfg = self.config
    norm = NormConfig.of(cfg)
    attention = attention_layer(cfg, self.dtype)
    h, state, aux = attention(x, state, ctx)
    x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    x = norm_layer(norm, 'attention_norm', self.dtype)(x)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    feed_forward = FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate,
                               self.dtype, name='feed_forward')
    h = feed_forward(x, deterministic=ctx.deterministic)
    x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    x = norm_layer(norm, 'feed_forward_norm', self.dtype)(x)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x, (state, aux)


def ends_normalised(cfg) -> bool:
  """True when the stack's output is already normalised (post-LN blocks: no final norm)."""
  return cfg.block == 'post_ln'

"""Two towers, one encoder: a classifier of document pairs (the Long Range Arena's Retrieval model).

Each document of a pair is encoded alone by the same encoder (models/encoder.py)
and pooled to one vector (`model.pooling`, through the tanh pooler); the pair
is classified from the two vectors' interaction

  z = [x1, x2, x1 * x2, x1 - x2]                      (Tay et al., 2020, sec. 3.3)

through one hidden layer of `d_model` units (GELU) and a linear layer to
`num_classes` logits. LRA's paper describes this interaction; its released
head has it as an option (`interaction='NLI'`) that is off by default, when it
concatenates only [x1, x2].
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.layers.linear import projection
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.encoder import Encoder, embed_tokens, pooled_output

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


def pair_interaction(x1: jax.Array, x2: jax.Array) -> jax.Array:
  """`[b, d]`, `[b, d]` -> `[b, 4 d]`: [x1, x2, x1 * x2, x1 - x2]."""
  return jnp.concatenate([x1, x2, x1 * x2, x1 - x2], axis=-1)


class PairClassifier(nn.Module):
  """`(tokens [b, 2, L], ctx over the 2b documents [2b, L]) -> (logits [b, num_classes], aux)`.

  `ctx` is the encoder context of the pairs' documents flattened in order (row 2i is
  pair i's first document, row 2i + 1 its second): `tasks/retrieval.pair_context`.
  """
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, tokens: jax.Array, ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    batch, pair, length = tokens.shape
    x, _ = embed_tokens(cfg, tokens.reshape(batch * pair, length), ctx, dtype)
    h, aux = Encoder(cfg, dtype, name='encoder')(x, ctx)
    pooled = pooled_output(cfg, h, ctx, dtype).reshape(batch, pair, -1)
    hidden = projection(cfg.d_model, kernel_axes=('mlp', 'embed'), name='interaction',
                        dtype=dtype, use_bias=True, bias_axes=('embed',))(
                            pair_interaction(pooled[:, 0], pooled[:, 1]))
    hidden = nn.Dropout(cfg.dropout_rate)(nn.gelu(hidden), deterministic=ctx.deterministic)
    logits = projection(cfg.num_classes, kernel_axes=('embed', None), name='classifier',
                        dtype=dtype, use_bias=True, bias_axes=(None,))(hidden)
    return logits.astype(jnp.float32), aux

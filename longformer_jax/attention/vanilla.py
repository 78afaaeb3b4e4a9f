"""Vanilla softmax attention with rotary positions and an optional cache.

Causal (decoder) or bidirectional (encoder). With `mem_len = 0` it attends
within the chunk only; with `mem_len > 0` it also attends to a FIFO cache of
the previous `mem_len` hidden states (rotated at their stored positions, so
the cache is exact for RoPE: keys are made from cached hidden states at
every step, never cached after rotation).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core import cached_context
from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.layers.positional import apply_rotary
from longformer_jax.memory import fifo


class VanillaAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  No settings of its own: the shared `model.causal` and `model.mem_len`.
  """
  reads_mem_len = True

  num_heads: int
  head_dim: int
  d_model: int
  causal: bool = True
  dtype: jnp.dtype = jnp.float32

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, dtype, name=None):
    return cls(num_heads=config.num_heads, head_dim=config.head_dim,
               d_model=config.d_model, causal=config.causal,
               dtype=dtype, name=name)

  @staticmethod
  def init_state(config: ml_collections.ConfigDict, batch_size: int, dtype=jnp.float32):
    """An empty cache of `config.mem_len` hidden states per row."""
    return fifo.create(batch_size, config.mem_len, (config.d_model,), dtype)

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    context, new_state = cached_context.memory_and_chunk(state, x, ctx)
    q = cached_context.project_heads(x, self.num_heads, self.head_dim, 'query', self.dtype)
    k = cached_context.project_heads(context.values, self.num_heads, self.head_dim, 'key', self.dtype)
    v = cached_context.project_heads(context.values, self.num_heads, self.head_dim, 'value', self.dtype)
    # Rotate relative to the chunk's first position: q.k depends only on the
    # difference, and small angles keep float32 exact on long streams.
    origin = ctx.positions[:, :1]
    q = apply_rotary(q, ctx.positions - origin)
    k = apply_rotary(k, context.positions - origin)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / jnp.sqrt(self.head_dim).astype(self.dtype)
    mask = causal_document_mask(ctx.positions, ctx.segment_ids, context.positions,
                                context.segment_ids, context.valid, causal=self.causal)
    out = attend(logits, mask, v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return cached_context.project_output(out, self.d_model, self.dtype), new_state, {}

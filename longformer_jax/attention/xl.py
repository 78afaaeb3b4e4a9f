"""Transformer-XL attention (Dai et al., 2019).

Keys and values come from `[memory; chunk]`, where the memory holds the
previous `mem_len` hidden states of this layer's input (stop-gradient). The
score of query i and key j is (section 3.3):

  A_ij = q_i^T k_j + q_i^T W_kR R_{i-j} + u^T k_j + v^T W_kR R_{i-j}
       = (q_i + u)^T k_j + (q_i + v)^T W_kR R_{i-j}

with R the sinusoid of the relative distance i - j (clamped to `clamp_len`
when it is > 0). The positional term is computed once per distance and
moved into place with the relative shift (`relative_impl='shift'`, valid for
a continuous stream: slot j of the memory holds position p0 - mem_len + j),
or gathered from the entries' stored positions (`relative_impl='gather'`,
valid for any memory layout).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention import cached_context
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.dot_product import attend
from longformer_jax.attention.masking import causal_document_mask
from longformer_jax.layers.linear import projection
from longformer_jax.layers.positional import relative_shift, sinusoid_embedding
from longformer_jax.memory import fifo

RELATIVE_IMPLS = ('shift', 'gather')


class XLAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`."""
  num_heads: int
  head_dim: int
  d_model: int
  clamp_len: int = -1
  relative_impl: str = 'shift'
  dtype: jnp.dtype = jnp.float32

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, dtype, name=None):
    return cls(num_heads=config.num_heads, head_dim=config.head_dim,
               d_model=config.d_model, clamp_len=config.get('clamp_len', -1),
               relative_impl=config.get('relative_impl', 'shift'), dtype=dtype, name=name)

  @staticmethod
  def init_state(config: ml_collections.ConfigDict, batch_size: int, dtype=jnp.float32):
    """An empty memory of `config.mem_len` hidden states per row."""
    return fifo.create(batch_size, config.mem_len, (config.d_model,), dtype)

  def _clamp(self, distances: jax.Array) -> jax.Array:
    if self.clamp_len > 0:
      distances = jnp.minimum(distances, self.clamp_len)
    return distances

  def _relative_keys(self, distances: jax.Array) -> jax.Array:
    """W_kR R for `distances [n]` -> `[n, heads, head_dim]`."""
    r = sinusoid_embedding(self._clamp(distances), self.d_model).astype(self.dtype)
    return projection((self.num_heads, self.head_dim), kernel_axes=('embed', 'heads', 'head_dim'),
                      name='relative_key', dtype=self.dtype)(r)

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    if self.relative_impl not in RELATIVE_IMPLS:
      raise ValueError(f'relative_impl must be one of {RELATIVE_IMPLS}, got {self.relative_impl!r}')
    context, new_state = cached_context.memory_and_chunk(state, x, ctx)
    q = cached_context.project_heads(x, self.num_heads, self.head_dim, 'query', self.dtype)
    k = cached_context.project_heads(context.values, self.num_heads, self.head_dim, 'key', self.dtype)
    v = cached_context.project_heads(context.values, self.num_heads, self.head_dim, 'value', self.dtype)
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ('heads', 'head_dim'))
    u = self.param('content_bias', bias_init, (self.num_heads, self.head_dim), jnp.float32)
    v_bias = self.param('position_bias', bias_init, (self.num_heads, self.head_dim), jnp.float32)

    content = jnp.einsum('bqhd,bkhd->bhqk', q + u.astype(self.dtype), k)
    klen = context.positions.shape[1]
    if self.relative_impl == 'shift':
      # Column r of the raw scores is distance klen - 1 - r.
      rel_keys = self._relative_keys(jnp.arange(klen - 1, -1, -1))
      raw = jnp.einsum('bqhd,khd->bhqk', q + v_bias.astype(self.dtype), rel_keys)
      position = relative_shift(raw)
    else:
      # Scores for every distance 0..klen-1, then pick each pair's distance.
      rel_keys = self._relative_keys(jnp.arange(klen))
      per_distance = jnp.einsum('bqhd,khd->bhqk', q + v_bias.astype(self.dtype), rel_keys)
      distances = ctx.positions[:, :, None] - context.positions[:, None, :]
      distances = jnp.clip(distances, 0, klen - 1)
      position = jnp.take_along_axis(per_distance, distances[:, None], axis=-1)

    logits = (content + position) / jnp.sqrt(self.head_dim).astype(self.dtype)
    mask = causal_document_mask(ctx.positions, ctx.segment_ids, context.positions,
                                context.segment_ids, context.valid, causal=True)
    out = attend(logits, mask, v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return cached_context.project_output(out, self.d_model, self.dtype), new_state, {}

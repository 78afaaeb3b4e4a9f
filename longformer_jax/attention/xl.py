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

On a mesh with a `sequence` axis > 1 (inside `sharding.activation_sharding`),
the chunk is split along its length over that axis like the vanilla cache
path: the memory whole on every device, the chunk's keys by ring or
all-gather (zigzag for load balance), the content term per key block and the
position term looked up by each pair's distance i - j (clamped) in a
per-device table of (q_i + v)^T W_kR R_d, the 'gather' formulation, whatever
`relative_impl` says; the parts merged exactly by log-sum-exp
(attention/sequence_parallel/relative_attention.py; docs/scaling.md). It equals the
unsplit layer for both `relative_impl` values on continuous streams.
"""

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.section import Section
from longformer_jax.layers.linear import projection
from longformer_jax.layers.positional import relative_shift, sinusoid_embedding
from longformer_jax.memory import fifo
from longformer_jax.parallel import sequence_settings
from longformer_jax.attention.sequence_parallel.relative_attention import (
    sequence_parallel_relative_attention)


RELATIVE_IMPLS = ('shift', 'gather')


@dataclasses.dataclass(frozen=True)
class XLConfig(Section):
  """`config.model.xl`; the memory length is the shared `model.mem_len`."""
  clamp_len: int = -1           # clamp relative distances to this (-1: off)
  relative_impl: str = 'shift'  # shift (continuous streams) | gather (any memory layout)

  def validate(self, env) -> None:
    del env
    self.require(self.clamp_len == -1 or self.clamp_len > 0, 'clamp_len',
                 'must be -1 (off) or > 0')
    self.require(self.relative_impl in RELATIVE_IMPLS, 'relative_impl',
                 f'must be one of {RELATIVE_IMPLS}')


class XLAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  Attributes:
    shared: the layer's shape (`num_heads`, `head_dim`, `d_model`; attention/shared_settings.py).
    config: `XLConfig`, read through `relative_settings`.
  """
  Config = XLConfig
  reads_mem_len = True

  shared: SharedSettings
  config: XLConfig = XLConfig()
  dtype: jnp.dtype = jnp.float32

  def relative_settings(self) -> tuple[int, str]:
    """`(clamp_len, relative_impl)`: XL's own section. The variants built on XL override it
    (their own section's `clamp_len`; 'gather', their memory not being a continuous stream)."""
    return self.config.clamp_len, self.config.relative_impl

  @staticmethod
  def init_state(config: XLConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """An empty memory of `shared.mem_len` hidden states per row:
    `[batch_size, mem_len, d_model]`."""
    del config
    return fifo.create(batch_size, shared.mem_len, (shared.d_model,), dtype)

  def _clamp(self, distances: jax.Array) -> jax.Array:
    clamp_len, _ = self.relative_settings()
    if clamp_len > 0:
      distances = jnp.minimum(distances, clamp_len)
    return distances

  def _relative_keys(self, distances: jax.Array) -> jax.Array:
    """W_kR R for `distances [n]` -> `[n, heads, head_dim]`."""
    r = sinusoid_embedding(self._clamp(distances), self.shared.d_model).astype(self.dtype)
    return projection((self.shared.num_heads, self.shared.head_dim),
                      kernel_axes=('embed', 'heads', 'head_dim'),
                      name='relative_key', dtype=self.dtype)(r)

  def position_scores(self, q_biased: jax.Array, q_positions: jax.Array,
                      k_positions: jax.Array, num_distances: int) -> jax.Array:
    """The (q_i + v)^T W_kR R_{i-j} term, gathered from stored positions.

    Args:
      q_biased: `[batch, q, heads, head_dim]`, the queries plus the bias v.
      q_positions: `[batch, q]`; k_positions: `[batch, k]`.
      num_distances: distances 0..num_distances-1 get their own R; larger
        (and negative, i.e. masked) distances are clipped into that range.
    Returns:
      `[batch, heads, q, k]`.
    """
    clamp_len, _ = self.relative_settings()
    if clamp_len > 0:
      # Distances >= clamp_len share R_{clamp_len}: a shorter table is the same.
      num_distances = min(num_distances, clamp_len + 1)
    rel_keys = self._relative_keys(jnp.arange(num_distances))
    per_distance = jnp.einsum('bqhd,khd->bhqk', q_biased, rel_keys)
    distances = q_positions[:, :, None] - k_positions[:, None, :]
    distances = jnp.clip(distances, 0, num_distances - 1)
    return jnp.take_along_axis(per_distance, distances[:, None], axis=-1)

  def _projections(self, x: jax.Array, context: fifo.FifoMemory):
    """`(q [b, c, h, d], k, v [b, k, h, d], u, v_bias [h, d])`: this layer's projections and
    biases (the variants built on XL share them, and their parameter names)."""
    heads, head_dim = self.shared.num_heads, self.shared.head_dim
    q = projections.project_heads(x, heads, head_dim, 'query', self.dtype)
    k = projections.project_heads(context.values, heads, head_dim, 'key', self.dtype)
    v = projections.project_heads(context.values, heads, head_dim, 'value', self.dtype)
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ('heads', 'head_dim'))
    u = self.param('content_bias', bias_init, (heads, head_dim), jnp.float32)
    v_bias = self.param('position_bias', bias_init, (heads, head_dim), jnp.float32)
    return q, k, v, u, v_bias

  def _sequence_split_attention(self, x: jax.Array, context: fifo.FifoMemory,
                                ctx: AttentionContext) -> jax.Array:
    """The chunk split over the mesh's `sequence` axis, the memory whole on every device:
    `[b, c, h, d]` (module docstring; attention/sequence_parallel/relative_attention.py)."""
    q, k, v, u, v_bias = self._projections(x, context)
    klen = context.positions.shape[1]
    mem = klen - x.shape[1]
    clamp_len, _ = self.relative_settings()
    num_distances = klen if clamp_len <= 0 else min(klen, clamp_len + 1)
    rel_keys = self._relative_keys(jnp.arange(num_distances))          # [D, h, d]
    memory = None if mem == 0 else (k[:, :mem], v[:, :mem], context.positions[:, :mem],
                                    context.segment_ids[:, :mem], context.valid[:, :mem])
    settings = sequence_settings.current()
    return sequence_parallel_relative_attention(
        q + u.astype(self.dtype), q + v_bias.astype(self.dtype), k[:, mem:], v[:, mem:],
        rel_keys, ctx.positions, ctx.segment_ids, ctx.valid,
        mesh=jax.sharding.get_abstract_mesh(), method=settings.method,
        load_balance=settings.load_balance, scale=self.shared.head_dim ** -0.5,
        memory=memory).astype(self.dtype)

  def attention_logits(self, x: jax.Array, context: fifo.FifoMemory, ctx: AttentionContext,
                       max_distance: Optional[int] = None):
    """Scores of the chunk's queries over the `context` entries.

    Creates this layer's projections and biases (the variants built on XL
    share them, and their parameter names).

    Args:
      x: `[batch, chunk, d_model]` the queries' source.
      context: `[batch, k]` entries (values `[batch, k, d_model]`) with
        positions, segment ids and valid bits.
      max_distance: None for `[memory; chunk]` in `relative_impl`'s layout;
        otherwise the largest query-key distance that needs its own R (any
        memory layout: the gathered relative positions are used).
    Returns:
      `(logits [batch, heads, q, k], mask [batch, q, k], values [batch, k, heads, head_dim])`.
    """
    q, k, v, u, v_bias = self._projections(x, context)
    content = jnp.einsum('bqhd,bkhd->bhqk', q + u.astype(self.dtype), k)
    klen = context.positions.shape[1]
    _, relative_impl = self.relative_settings()
    if max_distance is None and relative_impl == 'shift':
      # Column r of the raw scores is distance klen - 1 - r.
      rel_keys = self._relative_keys(jnp.arange(klen - 1, -1, -1))
      raw = jnp.einsum('bqhd,khd->bhqk', q + v_bias.astype(self.dtype), rel_keys)
      position = relative_shift(raw)
    else:
      # Scores for every distance 0..num_distances-1, then pick each pair's distance.
      num_distances = klen if max_distance is None else max_distance + 1
      position = self.position_scores(q + v_bias.astype(self.dtype), ctx.positions,
                                      context.positions, num_distances)

    logits = (content + position) / jnp.sqrt(self.shared.head_dim).astype(self.dtype)
    mask = causal_document_mask(ctx.positions, ctx.segment_ids, context.positions,
                                context.segment_ids, context.valid, causal=True)
    return logits, mask, v

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    _, relative_impl = self.relative_settings()
    if relative_impl not in RELATIVE_IMPLS:
      raise ValueError(f'relative_impl must be one of {RELATIVE_IMPLS}, got {relative_impl!r}')
    context, new_state = projections.memory_and_chunk(state, x, ctx)
    if sequence_settings.sequence_axis_size() > 1:
      out = self._sequence_split_attention(x, context, ctx)
    else:
      logits, mask, v = self.attention_logits(x, context, ctx)
      out = attend(logits, mask, v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, self.shared.d_model, self.dtype), new_state, {}

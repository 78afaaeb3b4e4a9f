"""Adaptive-Span attention (Sukhbaatar et al., 2019) on Transformer-XL scores.

Each head learns a span z in [0, S] (S = `max_span`, default `mem_len`,
the memory kept; S = mem_len + chunk lets every query see its whole
context), and
its attention weights are multiplied by the soft mask (eq. 2)

  m_z(x) = clamp((R + z - x) / R, 0, 1),   x = t - r the query-key distance,

before renormalisation (eq. 3): a_tr = m_z(t - r) e^{s_tr} / sum_q m_z(t - q) e^{s_tq}.
R (`ramp`) is the softness. The L1 penalty (eq. 4, lambda/M sum_i z_i)
is reported as the aux loss `span_loss` = mean of z over heads (its weight
lambda is `model.aux_loss_weights.span_loss`).

Learned spans are z = S clip(span_fraction, 0, 1) with a straight-through
clip: clipped in the forward pass, identity gradient
(`straight_through_clip`). The paper's code instead clamps the parameter
into [0, 1] after each optimiser step, keeping the whole gradient. A plain
`jnp.clip` would halve the gradient at exactly 0 or 1 and zero it outside,
so a span pushed below 0 by the penalty (easy from init = 0, the paper's
default) could never grow again. With the straight-through clip the gradient
is the one clamp-after-update sees: that of the loss at the clipped value.
The stored parameter itself is not clamped, so it can drift outside
[0, 1]. A span held below 0 by the penalty has to climb back to 0 before it
grows, where the paper's clamp would leave it at exactly 0.

Dynamic span (`dynamic=True`, section 3.2): z_t = S sigmoid(v . x_t + b)
per head and query token; the penalty is the mean of z_t over valid tokens.

The scores are Transformer-XL's (u, v, W_kR, sinusoid R, clamp_len) with
XL's parameter names; relative positions are gathered from the entries'
stored positions. Cost follows the spans: only the newest
n = min(S, ceil(R + max z)) memory entries (rounded up to `block`) can
get a non-zero weight, so the key/value projections and the attention run
over those n entries plus the chunk, chosen at run time by `jax.lax.switch`
among ceil(S / block) + 1 compiled sizes (`trim`). The memory itself keeps S
entries (a fixed shape), so a span that grows again finds its context.

Settings: `config.model.adaptive_span` (`AdaptiveSpanConfig`); the memory
length is the shared `model.mem_len`.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import soft_masked_softmax
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.section import Section
from longformer_jax.layers.linear import ProjectionKernel, projection
from longformer_jax.layers.positional import sinusoid_embedding
from longformer_jax.memory import fifo


@dataclasses.dataclass(frozen=True)
class AdaptiveSpanConfig(Section):
  """`config.model.adaptive_span`; the memory length is the shared `model.mem_len`."""
  max_span: int = 0         # S, the largest span (0: model.mem_len)
  ramp: float = 32.0        # R, the soft mask's ramp
  init: float = 0.0         # z / S at initialisation (learned spans)
  block: int = 64           # trimming granularity: memory sizes are multiples of this
  dynamic: bool = False     # True: z_t = S sigmoid(v . x_t + b) per head and token
  trim: bool = True         # attend only over the memory entries a span can reach
  clamp_len: int = -1       # clamp relative distances to this (-1: off)

  def validate(self, env) -> None:
    self.require(self.max_span >= 0, 'max_span', 'must be >= 0 (0: model.mem_len)')
    self.require(self.ramp > 0, 'ramp', 'must be > 0')
    self.require(0.0 <= self.init <= 1.0, 'init', 'must be in [0, 1] (a fraction of S)')
    self.require(self.block >= 1, 'block', 'must be >= 1')
    self.require(not self.dynamic or self.init == 0.0, 'init',
                 'is read only by learned spans (dynamic=False)')
    self.require(self.clamp_len == -1 or self.clamp_len > 0, 'clamp_len',
                 'must be -1 (off) or > 0')
    if env is not None:
      self.require(self.max_span > 0 or env.model.mem_len > 0, 'max_span',
                   'must be > 0 when model.mem_len is 0 (0 takes mem_len)')


def largest_span(config) -> int:
  """S of a resolved model config: `adaptive_span.max_span`, or `mem_len` when 0."""
  return config.adaptive_span.max_span or config.mem_len


def span_mask(spans: jax.Array, distances: jax.Array, ramp: float) -> jax.Array:
  """m_z(x) = clamp((R + z - x) / R, 0, 1); `spans` and `distances` broadcast.

  The clamp passes the whole gradient on the closed interval [0, 1], as
  `torch.clamp` in the paper's code does: d m / d z = 1/R at the two corner
  keys x = z and x = z + R too. `jnp.clip` would give 1/(2R) there, halving
  the pull to grow a span at whole spans (z = 0, the initial span, and any
  integer span with integer distances).
  """
  ramped = (ramp + spans - distances.astype(jnp.float32)) / ramp
  inside = (ramped >= 0.0) & (ramped <= 1.0)
  return jnp.where(inside, ramped, jax.lax.stop_gradient(jnp.clip(ramped, 0.0, 1.0)))


def straight_through_clip(fraction: jax.Array) -> jax.Array:
  """clip(fraction, 0, 1) forward, identity backward (the learned span's z / S).

  The paper's code clamps the parameter back into [0, 1] after each optimiser
  step and keeps the whole gradient. `jnp.clip` in the forward pass would
  not: its gradient is halved at exactly 0 or 1 and zero outside, so a span
  that the L1 penalty pushes below 0 could never grow again. Here the
  gradient is that of the loss at the clipped value, as with clamp-after-update.
  """
  return fraction + jax.lax.stop_gradient(jnp.clip(fraction, 0.0, 1.0) - fraction)


def memory_sizes(mem_len: int, block: int) -> list[int]:
  """The trimmed memory sizes compiled: 0, block, 2 block, ..., mem_len."""
  return sorted({min(mem_len, j * block) for j in range(math.ceil(mem_len / block) + 1)})


def trimmed_size_index(max_span: jax.Array, ramp: float, mem_len: int, block: int) -> jax.Array:
  """Index into `memory_sizes` of the smallest size holding every entry with m_z > 0.

  The chunk's first query is the farthest from the memory: the entry k
  places back has distance k, and m_z(k) > 0 iff k < R + z.
  """
  needed = jnp.minimum(jnp.ceil(max_span + ramp) - 1.0, mem_len)
  return jnp.clip(jnp.ceil(needed / block), 0, len(memory_sizes(mem_len, block)) - 1).astype(jnp.int32)


class AdaptiveSpanAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  Attributes:
    shared: the layer's shape and `mem_len` (attention/shared_settings.py).
    config: `AdaptiveSpanConfig`.
  """
  shared: SharedSettings
  config: AdaptiveSpanConfig = AdaptiveSpanConfig()
  dtype: jnp.dtype = jnp.float32

  Config = AdaptiveSpanConfig
  reads_mem_len = True

  @staticmethod
  def init_state(config: AdaptiveSpanConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """The last `shared.mem_len` hidden states per row: `[batch_size, mem_len, d_model]`."""
    del config
    return fifo.create(batch_size, shared.mem_len, (shared.d_model,), dtype)

  @property
  def largest_span(self) -> int:
    """S: `config.max_span`, or the shared `mem_len` when it is 0."""
    return self.config.max_span or self.shared.mem_len

  def spans(self, x: jax.Array) -> jax.Array:
    """z: `[heads]` (static), or `[batch, chunk, heads]` (dynamic) in [0, S]."""
    if self.config.dynamic:
      logits = projection(self.shared.num_heads, kernel_axes=('embed', 'heads'),
                          name='span_predictor',
                          dtype=jnp.float32, use_bias=True, bias_axes=('heads',))(x.astype(jnp.float32))
      return self.largest_span * jax.nn.sigmoid(logits)
    init = nn.with_logical_partitioning(nn.initializers.constant(self.config.init), ('heads',))
    fraction = self.param('span_fraction', init, (self.shared.num_heads,), jnp.float32)
    return self.largest_span * straight_through_clip(fraction)

  def _relative_keys(self, count: int) -> jax.Array:
    """W_kR R for distances 0..count-1 -> `[count, heads, head_dim]`."""
    distances = jnp.arange(count)
    if self.config.clamp_len > 0:
      distances = jnp.minimum(distances, self.config.clamp_len)
    r = sinusoid_embedding(distances, self.shared.d_model).astype(self.dtype)
    return projection((self.shared.num_heads, self.shared.head_dim),
                      kernel_axes=('embed', 'heads', 'head_dim'),
                      name='relative_key', dtype=self.dtype)(r)

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    heads, head_dim, mem_len = self.shared.num_heads, self.shared.head_dim, self.shared.mem_len
    ramp, block = self.config.ramp, self.config.block
    context, new_state = projections.memory_and_chunk(state, x, ctx)
    chunk = x.shape[1]
    q = projections.project_heads(x, heads, head_dim, 'query', self.dtype)
    kernel_shape = dict(in_shape=(self.shared.d_model,), features=(heads, head_dim),
                        kernel_axes=('embed', 'heads', 'head_dim'))
    w_key = ProjectionKernel(**kernel_shape, name='key')().astype(self.dtype)
    w_value = ProjectionKernel(**kernel_shape, name='value')().astype(self.dtype)
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ('heads', 'head_dim'))
    u = self.param('content_bias', bias_init, (heads, head_dim), jnp.float32)
    v_bias = self.param('position_bias', bias_init, (heads, head_dim), jnp.float32)
    rel_keys = self._relative_keys(mem_len + chunk)
    z = self.spans(x)
    soft_spans = (jnp.transpose(z, (0, 2, 1))[..., None] if self.config.dynamic
                  else z[None, :, None, None])
    q_content = q + u.astype(self.dtype)
    q_position = q + v_bias.astype(self.dtype)

    def attend_over(size: int):
      """Attention over the newest `size` memory entries and the chunk: `[b, c, h, d]`."""
      def run(_):
        part = jax.tree_util.tree_map(lambda a: a[:, mem_len - size:], context)
        k = jnp.einsum('bkd,dhe->bkhe', part.values.astype(self.dtype), w_key)
        v = jnp.einsum('bkd,dhe->bkhe', part.values.astype(self.dtype), w_value)
        distances = ctx.positions[:, :, None] - part.positions[:, None, :]
        per_distance = jnp.einsum('bqhd,khd->bhqk', q_position, rel_keys[:size + chunk])
        position = jnp.take_along_axis(
            per_distance, jnp.clip(distances, 0, size + chunk - 1)[:, None], axis=-1)
        logits = (jnp.einsum('bqhd,bkhd->bhqk', q_content, k) + position)
        logits = logits / jnp.sqrt(head_dim).astype(self.dtype)
        mask = causal_document_mask(ctx.positions, ctx.segment_ids, part.positions,
                                    part.segment_ids, part.valid, causal=True)
        soft = span_mask(soft_spans, distances[:, None], ramp)
        weights = soft_masked_softmax(logits, mask, soft)
        return jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
      return run

    sizes = memory_sizes(mem_len, block)
    if self.config.trim and len(sizes) > 1:
      index = trimmed_size_index(jax.lax.stop_gradient(jnp.max(z)), ramp, mem_len, block)
      out = jax.lax.switch(index, [attend_over(size) for size in sizes], None)
    else:
      out = attend_over(mem_len)(None)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    if self.config.dynamic:
      valid = ctx.valid.astype(jnp.float32)[..., None]
      mean_span = jnp.sum(z * valid) / jnp.maximum(jnp.sum(valid) * heads, 1.0)
    else:
      mean_span = jnp.mean(z)
    aux = {'span_loss': mean_span, 'span_largest': jnp.max(z)}
    return projections.project_output(out, self.shared.d_model, self.dtype), new_state, aux

"""Expire-Span attention (Sukhbaatar et al., 2021, "Not All Memories are Created Equal").

Transformer-XL attention (same projections, biases and gathered relative
positions, parameter names included) over `[memory; chunk]`, where every
entry i (a hidden state h_i of this layer's input, stored with its position)
has an expire span (Sukhbaatar et al., 2021, section 4)

  e_i = L * sigmoid(w . h_i + b),   r_ti = e_i - (t - i),
  m_ti = clamp(1 + r_ti / R, 0, 1)

and query t attends with the soft-masked, renormalised weights
`a_ti = m_ti exp(s_ti) / sum_j m_tj exp(s_tj)`. Entries with m_ti = 0 are
excluded from the softmax altogether, so they cannot change any output, not
even by rounding. e_i is recomputed each chunk from the stored h_i (memory
values are stop-gradient; the spans' parameters w, b get gradients through
the masks of every chunk in which the entry lies within the ramp).

Auxiliary loss, `expire_span_loss`, weighted by alpha =
`model.aux_loss_weights.expire_span_loss`, in one of two forms (`loss`):
  * 'mean_span', the paper's (same section): the mean of e_i over the chunk's valid
    tokens (each token counted once, in the chunk where it arrives), sum_i e_i / T;
  * 'ramp', the authors' code (facebookresearch/transformer-sequential,
    models/expire_span.py): only pairs on the ramp (0 < m_ti < 1) are penalised,
    sum over them of r_ti, divided by R and by the chunk's valid queries, averaged over
    rows. A span is pushed down only while its entry is being phased out, so a span
    that must stay long is not penalised for the queries that still read it whole.
Statistic: `memory_occupancy`, the fraction of memory slots in use after the chunk.

Pre-division (the authors' `--expire-span-pre-div`): e_i = L * sigmoid(w . h_i / p + b)
with p = `pre_div`: the span predictor moves p times slower than the rest of the layer,
so spans do not swing with every step (their enwik8 and copy-task runs use 64).

Memory: a fixed-capacity (`mem_len`, an upper bound) store of entries in a
`FifoMemory` container. After each chunk, an entry is kept iff it is valid,
belongs to the row's current document, and its mask is non-zero at the next
position t_next (one past the chunk's last valid token): masks only shrink as
t grows, so every dropped entry is masked for all later queries. Kept
entries are compacted (oldest first, free slots in front) and the chunk's
tokens fill the freed slots; if more than `mem_len` entries are alive, the
oldest ones are dropped, as in an XL cache.

Random memory shortening (the paper's regularisation, `shorten`): in training,
each chunk draws u ~ U(0, 1) from the 'dropout' stream and the masks use
min(e_i, u * L); the loss and the keep/drop decisions use e_i.

Settings: `config.model.expire_span` (`ExpireSpanConfig`); the memory
capacity is the shared `model.mem_len`.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import soft_masked_softmax
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.xl import XLAttention
from longformer_jax.config.section import Section
from longformer_jax.layers.linear import projection
from longformer_jax.memory import fifo


@dataclasses.dataclass(frozen=True)
class ExpireSpanConfig(Section):
  """`config.model.expire_span`; the memory capacity is the shared `model.mem_len`."""
  max_span: int = 0             # L, the largest span (0: model.mem_len)
  ramp: int = 32                # R, the length of the soft phase-out
  init_fraction: float = 0.5    # e_i / L at initialisation (sets the span bias)
  shorten: bool = False         # random memory shortening in training
  clamp_len: int = -1           # clamp relative distances to this (-1: off)
  pre_div: float = 1.0          # p: e_i = L sigmoid(w . h_i / p + b) (the authors' pre-division)
  loss: str = 'mean_span'       # 'mean_span' (the paper's formula) or 'ramp' (the authors' code)

  LOSSES = ('mean_span', 'ramp')

  def validate(self, env) -> None:
    self.require(self.max_span >= 0, 'max_span', 'must be >= 0 (0: model.mem_len)')
    self.require(self.ramp > 0, 'ramp', 'must be > 0')
    self.require(0.0 < self.init_fraction < 1.0, 'init_fraction', 'must be in (0, 1)')
    self.require(self.clamp_len == -1 or self.clamp_len > 0, 'clamp_len',
                 'must be -1 (off) or > 0')
    self.require(self.pre_div > 0, 'pre_div', 'must be > 0')
    self.require(self.loss in self.LOSSES, 'loss',
                 f'{self.loss!r}: use one of {", ".join(self.LOSSES)}')
    if env is not None:
      self.require(self.max_span > 0 or env.model.mem_len > 0, 'max_span',
                   'must be > 0 when model.mem_len is 0 (0 takes mem_len)')


def soft_expire_mask(spans: jax.Array, q_positions: jax.Array, k_positions: jax.Array,
                     ramp: float) -> jax.Array:
  """m_ti = clamp(1 + (e_i - (t - i)) / R, 0, 1): `[b, k]`, `[b, q]`, `[b, k]` -> `[b, q, k]` float32."""
  elapsed = (q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)
  remaining = spans.astype(jnp.float32)[:, None, :] - elapsed
  return jnp.clip(1.0 + remaining / ramp, 0.0, 1.0)


def ramp_loss(soft: jax.Array, ctx: AttentionContext, attendable: jax.Array,
              ramp: float) -> jax.Array:
  """The authors' span penalty: the mean over rows of sum_{t, i on the ramp} r_ti / (R * T).

  `soft [b, q, k]`: the layer's masks m_ti, from the spans after random shortening (as in
  their code); `attendable [b, q, k]`: the pairs a query may read (valid, same document,
  causal, within reach); T = the row's valid queries. On the ramp (0 < m_ti < 1) the mask is
  unclipped, so r_ti = e_i - (t - i) = R (m_ti - 1), with the same gradient; it lowers e_i
  by 1 / (R * T) for each query that reads entry i on its ramp.
  """
  on_ramp = (soft > 0) & (soft < 1) & attendable & ctx.valid[:, :, None]
  remaining = ramp * (soft - 1.0)                                            # r_ti
  queries = jnp.maximum(jnp.sum(ctx.valid.astype(jnp.float32), axis=1), 1.0)
  per_row = jnp.sum(jnp.where(on_ramp, remaining, 0.0), axis=(1, 2)) / (ramp * queries)
  return jnp.mean(per_row)


def next_query(ctx: AttentionContext) -> tuple[jax.Array, jax.Array]:
  """Per row, the position after the chunk's last valid token and that token's segment: `[b]`, `[b]`.

  The chunk's tokens are in stream order, so the last valid one is the last
  valid slot (the last slot when none is valid).
  """
  chunk_len = ctx.valid.shape[1]
  last = chunk_len - 1 - jnp.argmax(ctx.valid[:, ::-1], axis=1)
  last_position = jnp.take_along_axis(ctx.positions, last[:, None], axis=1)[:, 0]
  last_segment = jnp.take_along_axis(ctx.segment_ids, last[:, None], axis=1)[:, 0]
  return last_position + 1, last_segment


def keep_newest(entries: fifo.FifoMemory, keep: jax.Array, capacity: int) -> fifo.FifoMemory:
  """The newest `capacity` entries among those with `keep [b, n]`, compacted oldest first.

  Slots without a kept entry come first, invalid and zeroed. O(n log n) per row.
  """
  rank = jnp.where(keep, entries.positions, jnp.iinfo(jnp.int32).min)
  _, chosen = jax.lax.top_k(rank, capacity)                                 # newest first
  chosen = chosen[:, ::-1]
  gather = lambda a: jnp.take_along_axis(
      a, chosen.reshape(chosen.shape + (1,) * (a.ndim - 2)), axis=1)
  kept = gather(keep)
  # Free slots hold zeros: nothing of a dropped entry stays in the state.
  clear = lambda a: jnp.where(kept.reshape(kept.shape + (1,) * (a.ndim - 2)), a, jnp.zeros((), a.dtype))
  compacted = jax.tree_util.tree_map(lambda a: clear(gather(a)), entries)
  return compacted.replace(valid=kept)


class ExpireSpanAttention(XLAttention):
  """`__call__(x [b, c, d_model], state: FifoMemory, ctx) -> (y, state, aux)`.

  Attributes:
    shared: the layer's shape and `mem_len` (attention/shared_settings.py).
    config: `ExpireSpanConfig`: `max_span` (L, see `largest_span`), `ramp` (R, the length
      of the soft phase-out), `init_fraction` (e_i / L at w = 0: sets the initial b; w has
      the usual fan-in init), `shorten` (random memory shortening in training), XL's
      `clamp_len`, `pre_div` (p) and `loss` (the penalty's form, see the module docstring).
  """
  config: ExpireSpanConfig = ExpireSpanConfig()

  Config = ExpireSpanConfig
  reads_mem_len = True

  def relative_settings(self) -> tuple[int, str]:
    """`(clamp_len, 'gather')`: the kept entries are compacted, not a continuous stream, so
    relative positions are always gathered."""
    return self.config.clamp_len, 'gather'

  @property
  def largest_span(self) -> int:
    """L: `config.max_span`, or the shared `mem_len` when it is 0."""
    return self.config.max_span or self.shared.mem_len

  @staticmethod
  def init_state(config: ExpireSpanConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """An empty memory of at most `shared.mem_len` hidden states per row:
    `[batch_size, mem_len, d_model]`."""
    del config
    return fifo.create(batch_size, shared.mem_len, (shared.d_model,), dtype)

  def expire_spans(self, h: jax.Array) -> jax.Array:
    """e_i = L * sigmoid(w . h_i / p + b): `[b, k, d_model]` -> float32 `[b, k]`."""
    score = projection(1, kernel_axes=('embed', None), name='expire_span', dtype=self.dtype)(h)
    fraction = self.config.init_fraction
    bias_init = nn.initializers.constant(math.log(fraction / (1 - fraction)))
    bias = self.param('expire_span_bias', bias_init, (), jnp.float32)
    score = score[..., 0].astype(jnp.float32) / self.config.pre_div
    return self.largest_span * jax.nn.sigmoid(score + bias)

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    memory = fifo.clear_rows(state, ctx.reset)
    chunk = projections.chunk_entries(x, ctx)
    context = fifo.concat(jax.lax.stop_gradient(memory), chunk)
    # Keys farther than L + R are masked (m = 0): their relative position is irrelevant.
    ramp = self.config.ramp
    logits, mask, v = self.attention_logits(x, context, ctx, self.largest_span + ramp)

    spans = self.expire_spans(context.values)                               # [b, mem + c]
    mask_spans = spans
    if self.config.shorten and not ctx.deterministic:
      limit = jax.random.uniform(self.make_rng('dropout'), ()) * self.largest_span
      mask_spans = jnp.minimum(spans, limit)
    soft = soft_expire_mask(mask_spans, ctx.positions, context.positions, ramp)
    # Keys with m = 0 leave the softmax: a dropped entry cannot even change the rounding.
    weights = soft_masked_softmax(logits, mask & (soft > 0), soft[:, None])
    out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    y = projections.project_output(out, self.shared.d_model, self.dtype)

    t_next, segment = next_query(ctx)
    alive = (context.valid & (context.segment_ids == segment[:, None])
             & (soft_expire_mask(jax.lax.stop_gradient(spans), t_next[:, None],
                                 context.positions, ramp)[:, 0] > 0))
    new_state = keep_newest(jax.lax.stop_gradient(context), alive, memory.capacity)

    if self.config.loss == 'ramp':
      loss = ramp_loss(soft, ctx, mask, ramp)
    else:
      valid = ctx.valid.astype(jnp.float32)
      chunk_spans = spans[:, memory.capacity:]
      loss = jnp.sum(chunk_spans * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    occupancy = jnp.mean(new_state.valid.astype(jnp.float32)) if memory.capacity \
        else jnp.zeros((), jnp.float32)
    return y, new_state, {'expire_span_loss': loss, 'memory_occupancy': occupancy}

"""Attendre attention: wait to attend by retrieval with evicted queries.

Yang & Hua et al. (2024), "Attendre: Wait to attend by retrieval with evicted
queries in memory-based transformers for long context processing". Two
memories per layer and row:

- a FIFO **Q memory** of the last `q_memory_size` (N) queries
  (`memory/fifo.py`: a shift register, so queries leave it in stream order,
  exactly N positions after they came in, and padding pushes them out; the
  policy memory of memory/data_only.py would keep them, since its insert
  evicts invalid entries first);
- a **K/V memory** of `memory_size` (M) keys and values with any eviction
  policy (`memory/key_value.py`, `memory/policies.py`: fifo, lru, lfu,
  lra_{last,max,sum}, lfa with decay, sink), shared by all heads (token
  eviction) or, with `per_head_scores`, one memory per head, each evicting
  on its own head's attention (H2O's per-head heavy hitters).

Each step (a chunk of C tokens), in the order `order` picks:
 1. the chunk's queries go into the Q memory; the C queries it evicts are
    the ones that attend now (with N = 0: the chunk's own queries);
 2. K/V entries that no pending query can attend to any more are dropped
    (documents whose queries have all been answered: see
    `forget_finished_documents`);
 3. `order='insert_first'` (the paper's, Figure 1): the chunk's keys and
    values are inserted into the K/V memory (new entries score mean - k*std,
    the paper's initial score; with `admission='score'` they compete with the
    memory's entries on it, else they always go in) and the victims are
    evicted; then the evicted queries retrieve from the memory alone: at
    most M keys (or, with `top_k = k > 0`, the k with the highest attention
    logit per (query, head)), the chunk's own keys only as far as they were
    kept. The policy then folds the attention weights into the scores of
    every entry, new ones included (LRA/LFA use the weights, LRU/LFU a
    used-or-not mask), each pooled over the queries that may see the entry.
    `order='attend_first'` (the section's default, this codebase's order
    before the paper's was offered: recorded results and old checkpoints
    reproduce with it): the evicted queries attend to [K/V memory; the
    chunk's keys] (up to M + C keys; top-k over the memory part only), the
    policy scores the memory entries, and then the chunk is inserted, so a
    chunk's attention to itself never enters the scores.
 The memory may hold keys that come after a delayed query: with
 `causal=False` it sees them (bidirectional), except, with `hide_predicted`,
 the keys of predicted tokens (`ctx.predicted`, stored per entry); with
 `causal=True` the position rule masks them (and LRA leaves an entry no
 query may see with its score).

Delay: the output of a step is the attention output of the *evicted* queries,
so `y[:, j]` belongs to position `ctx.positions[:, j] - N` (a continuous
stream). A stack of such layers is time-shifted: `models/attendre_delay.py`.
To finish an input, run the remaining queries out with `flush` (one extra
step whose chunk is N padding tokens: it evicts all N queries at once) or
`drain` (padding chunks of the usual length). Padding tokens (`valid`
False) enter the Q memory as invalid queries (their outputs are zero rows)
and never displace valid K/V entries (the insert ranks invalid entries
first).

Positions: RoPE relative to the chunk's first position (as vanilla does)
through `layers/capped_rotary.py`, with the
LM-Infinite distance cap `rope_max_distance` (L; -1 = plain RoPE): scores
are `q_i^T R(min(p_i - p_j, L)) k_j` (and `max(., -L)` for future keys when
bidirectional). Keys and values are stored before rotation, stop-gradient (unless
`memory_gradients`: then within a training step they pass gradients back).

Documents: a row's Q memory is never cleared (its queries are still owed an
output); a K/V entry is dropped once every pending query comes from a later
document (segment id), or lies at/after the row's latest `reset`. With
N = 0 this is exactly clearing the memory at a reset. With N > 0 the next
document's first chunks share the K/V memory with the previous document's
last pending queries (each only attends to its own document, but they
compete for slots): documents are independent when each is followed by a
flush or drain before the next one starts.

Decoder use: with `causal=False` and N > 0 a query sees keys after it, so in
a language model that would leak the targets; LM evaluation uses N = 0
(eviction policies only) or `causal=True`. An encoder, or a decoder over its
prompt (prefix), uses `causal=False`.

Parameters are vanilla's (`query`, `key`, `value`, `out`, same shapes), so a
model trained with `attention='vanilla'` runs with this layer at evaluation
time.

Settings: `config.model.attendre` (`AttendreConfig`, per layer through
`model.layer_schedule.attendre`): `memory_size` (M), `q_memory_size` (N),
`policy` and the policy's settings (memory/policies.py; `per_head_scores`
gives every head its own memory of M entries, rows `b * heads + h`),
`top_k` (0 = all entries), `top_k_method`, `recall_target`,
`rope_max_distance`, `order` ('attend_first' default | 'insert_first', the
paper's; configs/attendre.py and pg19_attendre.py use 'insert_first' with
`admission='score'`); and the shared `model.causal`.
"""

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.attention.core.masking import causal_document_mask, hide_predicted_ahead
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.section import Section
from longformer_jax.memory import entries, fifo, key_value, policies
from longformer_jax.memory.entries import MemoryEntries
from longformer_jax.memory.sharded_retrieval import METHODS, top_k

_INT32_MIN = jnp.iinfo(jnp.int32).min
_INT32_MAX = jnp.iinfo(jnp.int32).max
# Step orders: insert the chunk, then retrieve from the memory (the paper's
# Figure 1) | attend to [memory; chunk], then insert (the default: recorded results).
ORDERS = ('insert_first', 'attend_first')


@flax.struct.dataclass
class AttendreState:
  """One layer's memories; leaves `[batch, ...]`.

  Attributes:
    queries: Q memory, `values [batch, N, heads, head_dim]` (unrotated queries).
    memory: K/V memory, data `{'keys', 'values'}: [batch, M, heads, head_dim]`;
      with per-head scores `[batch * heads, M, 1, head_dim]` (row b * heads + h);
      with `hide_predicted` also `'predicted': [rows, M]` bool (ctx.predicted).
    document_start: `[batch]` int32 position of the row's latest reset.
  """
  queries: fifo.FifoMemory
  memory: MemoryEntries
  document_start: jax.Array


@dataclasses.dataclass(frozen=True)
class AttendreConfig(Section):
  """`config.model.attendre`: the two memories, the eviction policy, retrieval, positions."""
  memory_size: int = 128            # M: K/V memory entries per row (per head with per_head_scores)
  q_memory_size: int = 0            # N: delayed queries (> 0 needs model.stack='attendre_delay')
  policy: str = 'fifo'              # fifo | sink | lru | lfu | lra | lra_{last,max,sum} | lfa
  lra_pooling: str = 'max'          # policy 'lra': last | max | sum ('lra_max' names it instead)
  lfa_gamma: float = 1.0            # policy 'lfa': decay in (0, 1] (1: LFA-0)
  num_sinks: int = 0                # policy 'sink': the first positions of a document kept
  init_std_multiplier: float = 1.0  # scored policies: new entries score mean - k * std
  admission: str = 'always'         # scored policies: new entries always go in | compete on score
  recent_window: int = 0            # the r most recent entries are never evicted (0: none)
  per_head_scores: bool = False     # one memory per head, evicting on its own head's attention
  top_k: int = 0                    # attend to the k best memory entries per query/head (0: all)
  top_k_method: str = 'exact'       # exact (lax.top_k) | approx (lax.approx_max_k)
  recall_target: float = 0.95       # top_k_method='approx': its recall target
  rope_max_distance: int = -1       # LM-Infinite cap on RoPE distances (-1: off)
  # insert_first: insert the chunk, then retrieve from the memory (the paper's Figure 1) |
  # attend_first: attend to [memory; chunk], then insert (default: recorded results reproduce)
  order: str = 'attend_first'
  # True: within a training step, queries waiting in the Q memory and K/V entries carry
  # their gradient back to the chunk that wrote them (across steps the memory is data).
  memory_gradients: bool = False
  # True (with causal=False): keys of predicted tokens (ctx.predicted, the loss's targets)
  # are hidden from the queries before them, so delayed queries look ahead at the prompt
  # only (a prefix-LM mask): the Q memory's look-ahead in training (train/delayed_targets.py).
  hide_predicted: bool = False

  def eviction_policy(self) -> policies.EvictionPolicy:
    """The K/V memory's eviction policy: `policy` with the settings it reads
    (memory/policies.make_policy)."""
    return policies.make_policy(self)

  def validate(self, env) -> None:
    self.require(self.memory_size >= 0, 'memory_size', 'must be >= 0')
    self.require(self.q_memory_size >= 0, 'q_memory_size', 'must be >= 0 (0: no delay)')
    self.require(self.policy in policies.POLICY_CHOICES, 'policy',
                 f'is not an eviction policy; choose one of {policies.POLICY_CHOICES}')
    self.require(self.lra_pooling in policies.LRA_POOLINGS, 'lra_pooling',
                 f'must be one of {policies.LRA_POOLINGS}')
    self.require(0.0 < self.lfa_gamma <= 1.0, 'lfa_gamma', 'must be in (0, 1]')
    self.require(self.num_sinks >= 0, 'num_sinks', 'must be >= 0')
    self.require(self.policy != 'sink' or self.num_sinks >= 1, 'num_sinks',
                 "must be >= 1 with policy='sink' (no sinks is policy 'fifo')")
    self.require(self.init_std_multiplier >= 0.0, 'init_std_multiplier', 'must be >= 0')
    self.require(self.admission in policies.ADMISSIONS, 'admission',
                 f'must be one of {policies.ADMISSIONS}')
    # num_sinks is left out: runs made before the sections set it beside other policies.
    for name in ('lra_pooling', 'lfa_gamma', 'init_std_multiplier', 'admission'):
      readers = policies.POLICY_SETTINGS[name]
      self.require(policies.reads_setting(self.policy, name)
                   or getattr(self, name) == getattr(AttendreConfig, name), name,
                   f'is read only by policy {" | ".join(readers)} (policy is {self.policy!r})')
    self.require(self.recent_window >= 0, 'recent_window', 'must be >= 0 (0: none)')
    self.require(self.top_k >= 0, 'top_k', 'must be >= 0 (0: every memory entry)')
    self.require(self.top_k_method in METHODS, 'top_k_method', f'must be one of {METHODS}')
    self.require(self.top_k > 0 or self.top_k_method == 'exact', 'top_k_method',
                 'is read only with top_k > 0')
    self.require(0.0 < self.recall_target <= 1.0, 'recall_target', 'must be in (0, 1]')
    self.require(self.top_k_method == 'approx' or self.recall_target == 0.95, 'recall_target',
                 "is read only by top_k_method='approx'")
    self.require(self.rope_max_distance >= -1, 'rope_max_distance', 'must be -1 (off) or >= 0')
    if env is not None:
      self.require(self.rope_max_distance == -1 or env.model.position_embedding == 'rotary',
                   'rope_max_distance', "caps RoPE distances; with model.position_embedding="
                   "'learned' there is no rotation to cap (keep -1)")
    self.require(self.order in ORDERS, 'order', f'must be one of {ORDERS}')
    self.require(self.order != 'insert_first' or self.memory_size >= 1, 'order',
                 "'insert_first' needs memory_size >= 1 (queries retrieve from the memory alone)")
    if env is not None:
      self.require(not (self.hide_predicted and env.model.causal), 'hide_predicted',
                   'is read only with model.causal=False (the causal mask hides every '
                   'later key already)')
      self.require(self.q_memory_size == 0 or env.model.stack == 'attendre_delay',
                   'q_memory_size', f"> 0 needs model.stack='attendre_delay', not "
                   f"{env.model.stack!r}: a delayed output needs a skip path delayed as much")


def as_head_rows(tree, heads: int):
  """Per-head view for per-head memories: in any pytree, `[b, n, heads, d]`
  leaves become `[b * heads, n, 1, d]` (row b * heads + h) and metadata
  (`[b]`, `[b, n]`) is repeated per head."""
  return jax.tree_util.tree_map(
      lambda x: entries.heads_to_rows(x) if x.ndim >= 3 else entries.repeat_rows(x, heads), tree)


def pending_queries(queries: fifo.FifoMemory, chunk: fifo.FifoMemory) -> fifo.FifoMemory:
  """The queries still owed an output at this step: the Q memory and the chunk's."""
  return fifo.concat(queries, chunk)


def forget_finished_documents(memory: MemoryEntries, pending: fifo.FifoMemory,
                              document_start: jax.Array) -> MemoryEntries:
  """Drops the K/V entries that no pending query may attend to any more.

  An entry goes when some query is pending and every pending query is from a
  later document (larger segment id), or the row's latest reset lies at or
  before every pending query and the entry before it. Rows with no valid
  pending query (all padding) keep their memory.

  Args:
    memory: K/V entries `[batch, M]`.
    pending: `[batch, P]` queries not yet answered (this step's included).
    document_start: `[batch]` position of the row's latest reset.
  """
  any_pending = jnp.any(pending.valid, axis=1)[:, None]
  oldest_segment = jnp.min(jnp.where(pending.valid, pending.segment_ids, _INT32_MAX), axis=1)
  oldest_position = jnp.min(jnp.where(pending.valid, pending.positions, _INT32_MAX), axis=1)
  older_document = memory.segment_ids < oldest_segment[:, None]
  before_reset = ((memory.positions < document_start[:, None])
                  & (document_start <= oldest_position)[:, None])
  drop = any_pending & (older_document | before_reset)
  return memory.replace(valid=memory.valid & ~drop, scores=jnp.where(drop, 0.0, memory.scores))


def keep_top_k(logits: jax.Array, allowed: jax.Array, k: int, method: str,
               recall_target: float) -> jax.Array:
  """`[b, h, q, M]` mask: the k allowed memory entries with the highest logit.

  Args:
    logits: `[b, h, q, M]` attention logits of the memory entries.
    allowed: `[b, q, M]` the position/document mask.
  """
  masked = jnp.where(allowed[:, None], logits.astype(jnp.float32), -jnp.inf)
  values, indices = top_k(masked, min(k, masked.shape[-1]), method, recall_target)
  kept = policies.usage_from_topk(indices, masked.shape[-1], jnp.isfinite(values))
  return (kept > 0) & allowed[:, None]


class AttendreAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  `y[:, j]` is the output for the query evicted at slot j (position
  `ctx.positions[:, j] - q_memory_size` on a continuous stream).

  Attributes:
    shared: the layer's shape, `causal`, and how it projects its heads (`shared.heads`,
      imported checkpoints: attention/core/checkpoint_heads.py).
    config: `AttendreConfig`; its eviction policy is `config.eviction_policy()`.
  """
  Config = AttendreConfig

  shared: SharedSettings
  config: AttendreConfig = AttendreConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: AttendreConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Empty Q memory (`[batch_size, q_memory_size, num_heads, head_dim]`) and K/V memory
    (`memory_size` entries) per row."""
    heads = (shared.num_heads, shared.head_dim)
    memory = key_value.create(batch_size, config.memory_size, *heads, dtype,
                              per_head_rows=config.per_head_scores)
    if config.hide_predicted:
      memory = memory.replace(data={**memory.data, 'predicted': jnp.zeros_like(memory.valid)})
    return AttendreState(
        queries=fifo.create(batch_size, config.q_memory_size, heads, dtype),
        memory=memory, document_start=jnp.full((batch_size,), _INT32_MIN, jnp.int32))

  def attend(self, queries: fifo.FifoMemory, memory: MemoryEntries,
             chunk: MemoryEntries | None, origin: jax.Array, extent: jax.Array | None = None):
    """Evicted queries over [memory; chunk] (chunk None: the memory alone).

    Args:
      queries: `[b, q]` evicted queries, values `[b, q, h, d]` unrotated.
      memory: `[b, M]` K/V entries; chunk: `[b, C]` this chunk's K/V entries, or None.
      origin: `[b, 1]` positions are rotated relative to it (small angles keep
        float32 exact on long streams; scores depend only on differences).
      extent: `[b]` the chunk's sequence lengths for the length-dependent RoPE scalings
        (`CheckpointHeads.extent`; None for the others).
      (Per-head memories call it with rows `b * h` of one head each.)
    Returns:
      `(out [b, q, h, d], memory_weights [b, h, q, M] float32,
      memory_mask [b, 1, q, M] bool)`: the weights on the memory slots and
      which slots each query may see (position/document rule, before top-k).
    """
    parts = [memory] if chunk is None else [memory, chunk.replace(data={
        **chunk.data, **{name: chunk.data[name].astype(self.dtype) for name in ('keys', 'values')}})]
    joined = lambda get: jnp.concatenate([get(part) for part in parts], axis=1)
    keys, values = joined(lambda e: e.data['keys']), joined(lambda e: e.data['values'])
    positions, segments = joined(lambda e: e.positions), joined(lambda e: e.segment_ids)
    valid = joined(lambda e: e.valid)
    q = queries.values.astype(self.dtype)
    causal, section = self.shared.causal, self.config
    scores = self.shared.heads.scores(q, keys, queries.positions - origin, positions - origin,
                                      section.rope_max_distance, bidirectional=not causal,
                                      extent=extent)
    logits = scores / jnp.sqrt(self.shared.head_dim).astype(scores.dtype)
    allowed = causal_document_mask(queries.positions, queries.segment_ids, positions, segments,
                                   valid, causal=causal) & queries.valid[:, :, None]
    if section.hide_predicted:
      allowed = hide_predicted_ahead(allowed, queries.positions, positions,
                                     joined(lambda e: e.data['predicted']))
    capacity = memory.capacity
    mask = jnp.broadcast_to(allowed[:, None], logits.shape)
    if section.top_k > 0 and capacity > 0:
      kept = keep_top_k(logits[..., :capacity], allowed[..., :capacity], section.top_k,
                        section.top_k_method, float(section.recall_target))
      mask = jnp.concatenate([kept, mask[..., capacity:]], axis=-1)
    weights = masked_softmax(logits, mask)
    out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(values.dtype), values)
    return out, weights[..., :capacity], allowed[:, None, :, :capacity]

  @nn.compact
  def __call__(self, x: jax.Array, state: AttendreState, ctx: AttentionContext):
    heads, num_heads, head_dim = self.shared.heads, self.shared.num_heads, self.shared.head_dim
    policy, order = self.config.eviction_policy(), self.config.order
    q = heads.query(x, num_heads, head_dim, self.dtype)
    k, v = heads.keys_values(x, num_heads, head_dim, self.dtype)
    # 1. Q memory: the chunk's queries in, the oldest C out (Attendre, sec. 3).
    chunk_queries = fifo.FifoMemory(values=q, positions=ctx.positions,
                                    segment_ids=ctx.segment_ids, valid=ctx.valid)
    # Stop-gradient memories (the default) leave a layer whose queries wait a chunk or more
    # (N >= C) no gradient into its query, key and value projections: `memory_gradients`.
    cut = (lambda tree: tree) if self.config.memory_gradients else jax.lax.stop_gradient
    state_queries = cut(state.queries)
    pending = pending_queries(state_queries, chunk_queries)
    queries, evicted = fifo.insert(state_queries, chunk_queries)
    document_start = jnp.where(ctx.reset, ctx.positions[:, 0], state.document_start)
    chunk = key_value.entries_from_chunk(k, v, ctx.positions, ctx.segment_ids, ctx.valid)
    if self.config.hide_predicted:
      chunk = chunk.replace(data={**chunk.data, 'predicted': ctx.predicted_flags()})
    origin, row_document_start, evicted_rows = ctx.positions[:, :1], document_start, evicted
    extent = heads.extent(ctx.positions, ctx.valid)   # dynamic, longrope: the chunk's length
    if policy.per_head:  # one memory per head: (batch, head) pairs become rows
      pending, evicted_rows, chunk, row_document_start, origin, extent = as_head_rows(
          (pending, evicted, chunk, document_start, origin, extent), num_heads)
    # 2. Forget documents no pending query belongs to.
    memory = forget_finished_documents(cut(state.memory), pending,
                                       row_document_start)
    if order == 'insert_first':
      # 3. Insert the chunk, then retrieve from the K/V memory alone (the paper's Figure 1).
      # The chunk's kept keys and values carry their gradient in this step; the memory
      # handed on is stop-gradient.
      memory, _ = key_value.insert(memory, chunk, policy)
      out, memory_weights, memory_mask = self.attend(evicted_rows, memory, None, origin, extent)
    else:
      # 3. Attend: the evicted queries over [K/V memory; chunk].
      out, memory_weights, memory_mask = self.attend(evicted_rows, memory, chunk, origin, extent)
    if policy.per_head:
      out = entries.rows_to_heads(out, num_heads)                       # [b, q, h, d]
      by_head = lambda a: a.reshape((-1, num_heads) + a.shape[2:])
      memory_weights, memory_mask = by_head(memory_weights), by_head(memory_mask)
    # 4. Score the memory by what it was given (attend_first: then insert the chunk).
    usage = jax.lax.stop_gradient(memory_weights)   # scores rank entries; never differentiated
    if policy.name in ('lru', 'lfu'):
      usage = (memory_weights > 0).astype(jnp.float32)
    memory = policies.update_scores(policy, memory, usage, evicted.positions,
                                    evicted.valid, memory_mask)
    # What the policy saw and made of it, before this step's eviction (read by
    # benchmarks/passkey_eviction_scores.py; dropped unless 'intermediates' is mutable).
    self.sow('intermediates', 'attendre_scored', dict(
        weights=memory_weights, mask=memory_mask, scores=memory.scores,
        positions=memory.positions, valid=memory.valid))
    if order == 'attend_first':
      memory, _ = key_value.insert(memory, cut(chunk), policy)
    memory = cut(memory)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    y = heads.output(out, self.shared.d_model, self.dtype)
    aux = {'memory_occupancy': jnp.mean(memory.valid.astype(jnp.float32))}
    new_state = AttendreState(queries=cut(queries), memory=memory,
                              document_start=document_start)
    return y, new_state, aux

"""Eviction policies of the Attendre memory interface, as pure functions.

A policy is a frozen dataclass selected by name in configs (`make_policy`, from
the `config.model.attendre` section, `attention/attendre.py`).
Two pure functions do the work:

- `update_scores(policy, entries, attention_weights, query_positions,
  query_valid, query_key_mask)`: after a chunk's queries attended to (or
  retrieved from) the memory, fold what they gave each entry into its score.
- `eviction_keys` / `eviction_order`: the ranking of entries, first evicted
  first. Invalid entries go first; then unprotected entries before protected
  ones (the sink policy's sinks, and with `recent_window = r` the r valid
  entries with the largest positions); then, during an insert with
  `admission='always'`, existing entries before the new ones; then the
  lowest score; ties broken by the oldest position.

Score semantics (higher = keep), after Attendre (Yang & Hua et al., 2024,
sec. 3.1). `a[b, h, q, m]` is the attention weight query q gave memory slot m
in head h, and the query-key mask `S[b, q, m]` (the layer's 2-d
position/document mask) says which entries query q may see; without a mask
every query may see every entry. Only valid queries count, and a query counts
for an entry only where it may see it. Usage is tracked per token, as in the
paper ("a K/V is considered used if any head of the K/V is used"): unless
`per_head`, an entry is used by a query when any head used it, and
attention is summed over heads, `A[b, q, m] = sum_h a[b, h, q, m]` (all
heads evict the same entries). With `per_head` each row is one head and is
scored on that head alone (the paper's per-token-head variant).

- 'fifo': no score; the oldest positions are evicted.
- 'sink': no score; the `num_sinks` valid entries with the smallest positions
  are kept (StreamingLLM's attention sinks), FIFO for the rest.
- 'lru' (least recently used): `a` is a usage mask (> 0 means used: the entry
  was among a query's retrieved top-k, see `usage_from_topk`). The score of a
  used entry becomes the largest position of a valid query that used it (the
  clock is the stream position).
- 'lfu' (least frequently used): score += the number of valid queries that
  used the entry, through any head (a query that used it through two heads
  counts once; with `per_head`, through the row's head).
- 'lra' (least recently attended): the score is replaced by this chunk's
  attention pooled over the valid queries that may see the entry: 'last' =
  A at the last of them (largest position), 'max' = their max, 'sum' = their
  sum. An entry that no valid query may see keeps its score (in a causal
  layer with delayed queries, the chunk's own entries until some query can
  see them: they are not scored 0 and evicted first).
- 'lfa' (least frequently attended, decay gamma): with T the largest position
  of a valid query of this step and T' the row's clock (T of the last step
  that had a valid query; kept in the memory, entries.MemoryEntries.clock),
  score <- gamma^(T - T') * score + sum_{valid q that may see it} gamma^(T - p_q) A[q]
  so the score is sum_i gamma^(T - p_i) A_i over every query i that saw the
  entry, whatever padding or delayed queries fall between steps (the decay
  follows stream distance, not the number of queries). No decay at a row's
  first scored step after it was created or reset (no T'). gamma = 1 is
  LFA-0 (plain accumulation).
A row with no valid query keeps its scores and its clock; otherwise every
policy sets the clock of its valid entries to T (new entries take the row's
clock when inserted). `entries.clear_rows` resets it with the row.

Before these definitions followed the paper (see docs/variants.md), LFU
counted (head, query) pairs, LFA decayed by gamma^(number of valid queries),
and LRA pooled over every valid query whether or not it may see the entry;
the LRA / LFA numbers recorded in docs/results.md were measured then.

A recent window (`recent_window = r`, any policy) keeps the r most recent
entries whatever their score and lets the policy choose among the rest: a
scored policy then keeps "heavy hitters" beside a window of recent tokens,
as H2O does (Zhang et al., 2023). With FIFO it changes nothing.

New entries get the initial score `mean - k * std` of the memory's current
valid scores in that row (k = `init_std_multiplier`, population std; 0 when
the row holds no valid entry), as in Attendre (Yang & Hua et al., 2024).

Admission (`admission`), for the scored policies:
- 'always' (default): new entries always go in; the policy evicts among
  the existing entries (as a KV cache with heavy hitters does). With a
  chunk as long as the memory, every policy then keeps the same entries.
- 'score': new entries compete with the existing ones on their initial
  score, so a new entry is kept only if mean - k * std beats some existing
  entry's score (ties: the newest new entries are kept). A memory as small
  as one chunk can then hold on to much-attended old entries: the reading
  under which Attendre's policies differ from FIFO at M = chunk (its
  TriviaQA results at M = 128 with chunks of 128). Pair it with a small
  `recent_window` (16-32 of a 128-token chunk): alone it lets too few of the
  chunk's entries in. On configs/short_context_spm_long.py that pair (r = 16)
  beat FIFO and sinks on far recurrences of the validation split at M = 512
  in two runs at step 5,527; on the finished run (step 10,000) only LFA-0
  still does, at M = 512, and every scored row loses on the all-target
  average (docs/results.md, "Eval-time memories and eviction
  policies"; docs/eval_time_memory.md).
FIFO and sinks rank by position alone, so admission changes nothing for them.

Per-head scores (`per_head=True`): the memory has one row per (batch, head)
(row b * heads + h; see entries.heads_to_rows) and each row is scored with
its own head's weights (and query-key mask) only.
"""

import dataclasses

import jax
import jax.numpy as jnp

from longformer_jax.memory.entries import NO_CLOCK, MemoryEntries, row_clock

POLICY_NAMES = ('fifo', 'lru', 'lfu', 'lra', 'lfa', 'sink')
LRA_POOLINGS = ('last', 'max', 'sum')
# Names a config may give: the policies, and 'lra' with its pooling ('lra_max').
POLICY_CHOICES = POLICY_NAMES + tuple(f'lra_{pooling}' for pooling in LRA_POOLINGS)
ADMISSIONS = ('always', 'score')
SCORED_POLICIES = ('lru', 'lfu', 'lra', 'lfa')
# Settings only some policies read -> those policies (`reads_setting`); 'lra_pooling'
# is read by the name 'lra' alone ('lra_max' and the like set the pooling by name).
POLICY_SETTINGS = {'lra_pooling': ('lra',), 'lfa_gamma': ('lfa',), 'num_sinks': ('sink',),
                   'init_std_multiplier': SCORED_POLICIES, 'admission': SCORED_POLICIES}


@dataclasses.dataclass(frozen=True)
class EvictionPolicy:
  """A policy and its settings (configs name it: `attention/attendre.py` `AttendreConfig`).

  Bad values raise `ValueError`: configs are checked, with their keys, by the
  section that holds them before a policy is built.
  """
  name: str                          # one of POLICY_NAMES
  pooling: str = 'max'               # lra: 'last' | 'max' | 'sum'
  gamma: float = 1.0                 # lfa decay in (0, 1]
  num_sinks: int = 0                 # sink: keep the first num_sinks positions
  init_std_multiplier: float = 1.0   # new entries score mean - k * std
  per_head: bool = False             # one memory row per (batch, head)
  recent_window: int = 0             # keep the recent_window most recent entries
  admission: str = 'always'          # new entries: 'always' go in | compete on 'score'

  def __post_init__(self):
    problems = [
        (self.name in POLICY_NAMES, f'name {self.name!r} is not one of {POLICY_NAMES}'),
        (self.pooling in LRA_POOLINGS, f'pooling {self.pooling!r} is not one of {LRA_POOLINGS}'),
        (0.0 < self.gamma <= 1.0, f'gamma {self.gamma} is not in (0, 1]'),
        (int(self.num_sinks) == self.num_sinks and self.num_sinks >= 0,
         f'num_sinks {self.num_sinks} is not an integer >= 0'),
        (int(self.recent_window) == self.recent_window and self.recent_window >= 0,
         f'recent_window {self.recent_window} is not an integer >= 0'),
        (self.admission in ADMISSIONS, f'admission {self.admission!r} is not one of {ADMISSIONS}'),
        (self.init_std_multiplier >= 0.0,
         f'init_std_multiplier {self.init_std_multiplier} is not >= 0')]
    for ok, problem in problems:
      if not ok:
        raise ValueError(f'EvictionPolicy: {problem}')

  @property
  def uses_scores(self) -> bool:
    return self.name in SCORED_POLICIES


def policy_from_name(name: str, **settings) -> EvictionPolicy:
  """A policy from its name; 'lra_last' / 'lra_max' / 'lra_sum' set the pooling."""
  if name.startswith('lra_'):
    return EvictionPolicy('lra', pooling=name[len('lra_'):], **settings)
  return EvictionPolicy(name, **settings)


def base_name(name: str) -> str:
  """The policy of a config name: 'lra_max' -> 'lra', 'lfa' -> 'lfa'."""
  return 'lra' if name.startswith('lra_') else name


def reads_setting(name: str, setting: str) -> bool:
  """Whether the policy named `name` (a POLICY_CHOICES item) reads `setting`.

  Settings outside POLICY_SETTINGS (recent_window, per_head_scores) are read
  by every policy.
  """
  if setting not in POLICY_SETTINGS:
    return True
  return (name if setting == 'lra_pooling' else base_name(name)) in POLICY_SETTINGS[setting]


def make_policy(settings) -> EvictionPolicy:
  """The policy of an Attendre section (`config.model.attendre`, checked).

  Reads `policy` (a POLICY_CHOICES name), `lra_pooling` (for 'lra'),
  `lfa_gamma`, `num_sinks`, `init_std_multiplier`, `per_head_scores`,
  `recent_window` and `admission`.
  """
  kwargs = dict(gamma=float(settings.lfa_gamma), num_sinks=settings.num_sinks,
                init_std_multiplier=float(settings.init_std_multiplier),
                per_head=bool(settings.per_head_scores), recent_window=settings.recent_window,
                admission=settings.admission)
  if not settings.policy.startswith('lra_'):
    kwargs['pooling'] = settings.lra_pooling
  return policy_from_name(settings.policy, **kwargs)


# ----------------------------------------------------------------- scoring


def _scatter_to_slots(per_item: jax.Array, indices: jax.Array, capacity: int, combine: str):
  """`per_item [b, h, q, k]` written at slots `indices [b, h, q, k]` -> `[b, h, q, capacity]`."""
  leading = jnp.indices(indices.shape[:-1], sparse=True)             # broadcastable [b, h, q]
  where = tuple(i[..., None] for i in leading) + (indices,)
  slots = jnp.zeros(indices.shape[:-1] + (capacity,), jnp.float32).at[where]
  return slots.max(per_item) if combine == 'max' else slots.add(per_item)


def usage_from_topk(indices: jax.Array, capacity: int, valid: jax.Array | None = None) -> jax.Array:
  """Usage mask `[b, h, q, capacity]` float32 0/1 from retrieved `indices [b, h, q, k]`.

  An entry is used by (head, query) when it is among that query's top-k
  (and the retrieved item is `valid [b, h, q, k]`, when given).
  """
  hit = jnp.ones(indices.shape, jnp.float32) if valid is None else valid.astype(jnp.float32)
  return _scatter_to_slots(hit, indices, capacity, 'max')


def weights_to_slots(weights: jax.Array, indices: jax.Array, capacity: int,
                     valid: jax.Array | None = None) -> jax.Array:
  """Attention weights over retrieved items `[b, h, q, k]` as `[b, h, q, capacity]` over slots.

  For LRA / LFA with retrieval: each retrieved item's weight is added at its
  memory slot (`indices [b, h, q, k]`); entries not retrieved get 0, invalid
  items (`valid [b, h, q, k]` False) are dropped.
  """
  weights = weights.astype(jnp.float32)
  if valid is not None:
    weights = jnp.where(valid, weights, 0.0)
  return _scatter_to_slots(weights, indices, capacity, 'add')


def usage_from_retrieved(retrieved, capacity: int) -> jax.Array:
  """Usage mask `[b, h, q, capacity]` from a key_value.Retrieved (layout [b, q, h, k])."""
  to_bhqk = lambda x: jnp.swapaxes(x, 1, 2)
  return usage_from_topk(to_bhqk(retrieved.indices), capacity, to_bhqk(retrieved.valid))


_INT32_MIN = jnp.iinfo(jnp.int32).min


def _rows_view(policy, weights, mask, query_positions, query_valid, rows):
  """Weights and mask `[rows, h', q, m]`, queries `[rows, q]`, matching the memory's rows."""
  batch, heads = weights.shape[:2]
  mask = jnp.broadcast_to(mask, weights.shape)
  if policy.per_head:
    if rows != batch * heads:
      raise ValueError(f'per-head scores need a memory with batch*heads = {batch * heads} rows, '
                       f'got {rows}')
    weights = weights.reshape((batch * heads, 1) + weights.shape[2:])
    mask = mask.reshape(weights.shape)
    query_positions = jnp.repeat(query_positions, heads, axis=0)
    query_valid = jnp.repeat(query_valid, heads, axis=0)
  elif rows != batch:
    raise ValueError(f'attention weights have batch {batch}, the memory has {rows} rows')
  return weights, mask, query_positions, query_valid


def _lra_pooled(attention, seen, query_positions, pooling):
  """`attention [rows, q, m]` pooled over the queries that see each entry
  (`seen [rows, q, m]`) -> `[rows, m]` (meaningless where none does)."""
  if pooling == 'sum':
    return jnp.sum(jnp.where(seen, attention, 0.0), axis=1)
  if pooling == 'max':
    return jnp.max(jnp.where(seen, attention, -jnp.inf), axis=1)
  last = jnp.argmax(jnp.where(seen, query_positions[:, :, None], _INT32_MIN), axis=1)  # [rows, m]
  return jnp.take_along_axis(attention, last[:, None, :], axis=1)[:, 0]


def _lfa_accumulated(scores, clock, latest, attention, query_positions, query_valid, gamma):
  """LFA: `gamma^(T - T') * scores + sum_q gamma^(T - p_q) attention[q]` (module docstring).

  `clock [rows]` is T' (NO_CLOCK: no decay), `latest [rows]` T.
  """
  gamma = jnp.float32(gamma)
  has_previous = jnp.any(query_valid, axis=1) & (clock != NO_CLOCK)
  elapsed = jnp.where(has_previous, jnp.maximum(latest - clock, 0), 0).astype(jnp.float32)
  distance = jnp.maximum(latest[:, None] - query_positions, 0).astype(jnp.float32)
  decay = jnp.where(query_valid, gamma ** distance, 0.0)                 # [rows, q]
  added = jnp.einsum('rq,rqm->rm', decay, attention)
  return gamma ** elapsed[:, None] * scores + added


def update_scores(policy: EvictionPolicy, entries: MemoryEntries, attention_weights: jax.Array,
                  query_positions: jax.Array, query_valid: jax.Array,
                  query_key_mask: jax.Array | None = None) -> MemoryEntries:
  """Entries with scores updated by one chunk of queries (semantics: module docstring).

  Args:
    attention_weights: `[batch, heads, q, capacity]` softmax weights of the
      chunk's queries over the memory slots, or a 0/1 usage mask for 'lru' /
      'lfu' (`usage_from_topk`).
    query_positions: `[batch, q]` int32; query_valid: `[batch, q]` bool.
    query_key_mask: bool, broadcastable to `attention_weights`' shape
      (`[batch, 1, q, capacity]` for a mask shared by the heads): True where
      query q may see slot m. None: every query may see every entry.
  Returns entries whose valid slots have new scores (invalid slots score 0)
  and, in rows with a valid query, the clock T (the largest query position).
  """
  if policy.name == 'lfa' and entries.clock is None:
    raise ValueError("policy 'lfa' decays by the distance from the last scored query: score "
                     'entries that have a clock (data_only.create, key_value.create)')
  if query_key_mask is None:
    query_key_mask = jnp.ones((1, 1, 1, 1), bool)
  weights, mask, positions, valid = _rows_view(policy, attention_weights.astype(jnp.float32),
                                               query_key_mask.astype(bool), query_positions,
                                               query_valid, entries.rows)
  latest = jnp.max(jnp.where(valid, positions, _INT32_MIN), axis=1)     # T [rows]
  clock = None
  if entries.clock is not None:
    scored = entries.valid & jnp.any(valid, axis=1)[:, None]
    clock = jnp.where(scored, latest[:, None], entries.clock)
  if not policy.uses_scores:
    return entries.replace(clock=clock)
  seen_by_head = mask & valid[:, None, :, None]                          # [rows, h, q, m]
  old = entries.scores
  if policy.name in ('lru', 'lfu'):
    used = jnp.any((weights > 0) & seen_by_head, axis=1)                 # [rows, q, m] any head
    if policy.name == 'lfu':
      new = old + jnp.sum(used, axis=1).astype(jnp.float32)
    else:
      user_positions = jnp.where(used, positions[:, :, None], _INT32_MIN)
      new = jnp.where(jnp.any(used, axis=1), jnp.max(user_positions, axis=1).astype(jnp.float32),
                      old)
  else:
    attention = jnp.sum(jnp.where(seen_by_head, weights, 0.0), axis=1)  # [rows, q, m]
    if policy.name == 'lra':
      seen = jnp.any(seen_by_head, axis=1)                               # [rows, q, m]
      pooled = _lra_pooled(attention, seen, positions, policy.pooling)
      new = jnp.where(jnp.any(seen, axis=1), pooled, old)
    else:
      new = _lfa_accumulated(old, row_clock(entries), latest, attention, positions, valid,
                             policy.gamma)
  return entries.replace(scores=jnp.where(entries.valid, new, 0.0), clock=clock)


def initial_scores(policy: EvictionPolicy, entries: MemoryEntries) -> jax.Array:
  """`[rows]` score for new entries: mean - k * std of the valid scores (0 if none)."""
  if not policy.uses_scores:
    return jnp.zeros((entries.rows,), jnp.float32)
  weight = entries.valid.astype(jnp.float32)
  count = jnp.sum(weight, axis=1)
  safe_count = jnp.maximum(count, 1.0)
  mean = jnp.sum(weight * entries.scores, axis=1) / safe_count
  variance = jnp.sum(weight * (entries.scores - mean[:, None]) ** 2, axis=1) / safe_count
  score = mean - policy.init_std_multiplier * jnp.sqrt(variance)
  return jnp.where(count > 0, score, 0.0)


# ---------------------------------------------------------------- ranking


def _position_ranks(positions: jax.Array, valid: jax.Array, newest_first: bool) -> jax.Array:
  """`[rows, n]` rank of each valid entry by position (oldest or newest first; invalid last)."""
  big = jnp.iinfo(jnp.int32).max
  keyed = jnp.where(valid, -positions if newest_first else positions, big)
  slots = jnp.broadcast_to(jnp.arange(positions.shape[1]), positions.shape)
  _, order = jax.lax.sort((keyed, slots), dimension=1, num_keys=1)
  return jnp.zeros_like(order).at[jnp.arange(order.shape[0])[:, None], order].set(slots)


def sink_flags(policy: EvictionPolicy, positions: jax.Array, valid: jax.Array) -> jax.Array:
  """`[rows, n]` bool: the `num_sinks` valid entries with the smallest positions."""
  if policy.name != 'sink' or policy.num_sinks == 0:
    return jnp.zeros(positions.shape, bool)
  return valid & (_position_ranks(positions, valid, newest_first=False) < policy.num_sinks)


def recent_flags(policy: EvictionPolicy, positions: jax.Array, valid: jax.Array) -> jax.Array:
  """`[rows, n]` bool: the `recent_window` valid entries with the largest positions."""
  if policy.recent_window == 0:
    return jnp.zeros(positions.shape, bool)
  return valid & (_position_ranks(positions, valid, newest_first=True) < policy.recent_window)


def eviction_keys(policy: EvictionPolicy, entries: MemoryEntries,
                  is_new: jax.Array | None = None) -> tuple:
  """Sort keys `[rows, n]` (lexicographic, ascending = evicted first)."""
  if is_new is None or policy.admission == 'score':
    is_new = jnp.zeros(entries.positions.shape, bool)
  scores = entries.scores if policy.uses_scores else jnp.zeros_like(entries.scores)
  protected = (sink_flags(policy, entries.positions, entries.valid)
               | recent_flags(policy, entries.positions, entries.valid))
  return (entries.valid.astype(jnp.int32),
          protected.astype(jnp.int32),
          is_new.astype(jnp.int32),
          scores.astype(jnp.float32),
          entries.positions)


def ranked_slots(keys: tuple) -> jax.Array:
  """`[rows, n]` slot indices sorted by `keys`, first evicted first (stable)."""
  slots = jnp.broadcast_to(jnp.arange(keys[0].shape[1], dtype=jnp.int32), keys[0].shape)
  return jax.lax.sort(keys + (slots,), dimension=1, num_keys=len(keys))[-1]


def eviction_order(policy: EvictionPolicy, entries: MemoryEntries) -> jax.Array:
  """`[rows, capacity]`: the memory's slots in the order the policy would evict them."""
  return ranked_slots(eviction_keys(policy, entries))

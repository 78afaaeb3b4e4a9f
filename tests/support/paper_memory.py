"""Every eviction policy as a plain-Python memory written from the papers' definitions
(`PaperMemory`), driven alongside a data-only memory through many chunks of random attention
(`run_stream`); tests/memory/test_policy_reference.py says what is held equal."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.memory import data_only, entries, policies

BATCH, HEADS = 2, 2


class PaperMemory:
  """One memory row: position -> score, and T' (the last scored step's largest query position)."""

  def __init__(self, capacity, policy):
    self.capacity, self.policy = capacity, policy
    self.scores, self.last_query = {}, None

  def reset(self):
    self.scores, self.last_query = {}, None

  def initial_score(self):
    if not self.policy.uses_scores or not self.scores:
      return 0.0
    values = list(self.scores.values())
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return mean - self.policy.init_std_multiplier * std

  def insert(self, new_positions):
    """Inserts the valid new entries; returns the positions evicted."""
    initial = self.initial_score()
    candidates = dict(self.scores)
    for p in new_positions:
      candidates[p] = initial
    overflow = len(candidates) - self.capacity
    if overflow <= 0:
      self.scores = candidates
      return []
    by_age = sorted(candidates)
    protected = set()
    if self.policy.name == 'sink':
      protected |= set(by_age[:self.policy.num_sinks])
    if self.policy.recent_window:
      protected |= set(by_age[-self.policy.recent_window:])
    new_wait = self.policy.admission == 'always'

    def evicted_first(p):
      score = candidates[p] if self.policy.uses_scores else 0.0
      return (p in protected, new_wait and p in new_positions, score, p)
    evicted = sorted(candidates, key=evicted_first)[:overflow]
    self.scores = {p: s for p, s in candidates.items() if p not in evicted}
    return evicted

  def score(self, queries, weights, sees):
    """One step's queries: `queries` [(position, valid)], `weights[h][i][p]` the weight (or
    0/1 use) query i gave entry p in head h, `sees[i]` the entries query i may see."""
    name, gamma = self.policy.name, self.policy.gamma
    valid = [i for i, (_, ok) in enumerate(queries) if ok]
    if not valid:
      return
    latest = max(queries[i][0] for i in valid)
    for p in self.scores:
      seers = [i for i in valid if p in sees[i]]
      used = [i for i in seers if any(w[i][p] > 0 for w in weights)]
      attention = {i: sum(w[i][p] for w in weights) for i in seers}
      if name == 'lru' and used:
        self.scores[p] = float(max(queries[i][0] for i in used))
      elif name == 'lfu':
        self.scores[p] += len(used)
      elif name == 'lra' and seers:
        if self.policy.pooling == 'last':
          self.scores[p] = attention[max(seers, key=lambda i: queries[i][0])]
        elif self.policy.pooling == 'max':
          self.scores[p] = max(attention.values())
        else:
          self.scores[p] = sum(attention.values())
      elif name == 'lfa':
        decay = 1.0 if self.last_query is None else gamma ** (latest - self.last_query)
        self.scores[p] = decay * self.scores[p] + sum(
            gamma ** (latest - queries[i][0]) * attention[i] for i in seers)
    self.last_query = latest


_clear = jax.jit(data_only.clear_rows)


def _jitted(policy):
  insert = jax.jit(lambda m, n: data_only.insert(m, n, policy))
  score = jax.jit(lambda m, w, p, v, s: policies.update_scores(policy, m, w, p, v, s))
  return insert, score


def _row_contents(memory, r):
  """{position: (slot, score)} of the valid entries of row r; data must equal the position."""
  positions, valid = np.asarray(memory.positions[r]), np.asarray(memory.valid[r])
  data, scores = np.asarray(memory.data[r, :, 0]), np.asarray(memory.scores[r])
  np.testing.assert_array_equal(data[valid], positions[valid])
  return {int(positions[j]): (j, float(scores[j])) for j in np.flatnonzero(valid)}


def _random_attention(rng, policy, memory, queries, causal):
  """Weights `[BATCH, HEADS, q, M]` and mask `[BATCH, HEADS, q, M]` over the memory's slots,
  and for each row the reference's view: (weights[h][i][position], sees[i])."""
  rows, capacity = memory.rows, memory.capacity
  q = queries[0].shape[1]
  weights = rng.random((BATCH, HEADS, q, capacity)).astype(np.float32)   # garbage by default
  mask = np.zeros((BATCH, HEADS, q, capacity), bool)
  per_row = []
  for b in range(BATCH):
    positions = queries[0][b]
    for h in range(HEADS):
      r = b * HEADS + h if rows == BATCH * HEADS else b
      contents = _row_contents(memory, r)
      if rows == BATCH and h > 0:
        mask[b, h] = mask[b, 0]        # the query-key mask is per token: heads share it
      else:                            # causal (or not), and a random tenth of pairs hidden
        for i in range(q):
          for p, (j, _) in contents.items():
            mask[b, h, i, j] = (not causal or p <= positions[i]) and rng.random() > 0.1
      for i in range(q):
        slots = [j for j, _ in contents.values() if mask[b, h, i, j]]
        weights[b, h, i, [j for j, _ in contents.values() if not mask[b, h, i, j]]] = rng.random()
        if not slots:
          continue
        if policy.name in ('lru', 'lfu'):
          use = np.zeros(capacity, np.float32)
          use[rng.permutation(slots)[:3]] = 1.0
          use[slots] *= rng.random(len(slots)) > 0.2
          weights[b, h, i, slots] = use[slots]
        else:
          logits = rng.normal(size=len(slots)) * 2
          weights[b, h, i, slots] = np.exp(logits) / np.exp(logits).sum()
  for r in range(rows):
    b = r // (rows // BATCH)
    heads = [r % HEADS] if rows == BATCH * HEADS else list(range(HEADS))
    contents = _row_contents(memory, r)
    w = [[{p: float(weights[b, h, i, j]) for p, (j, _) in contents.items()} for i in range(q)]
         for h in heads]
    sees = [{p for p, (j, _) in contents.items() if mask[b, heads[0], i, j]} for i in range(q)]
    per_row.append((w, sees))
  shared_mask = mask if rows == BATCH * HEADS else mask[:, :1]
  return jnp.asarray(weights), jnp.asarray(shared_mask), per_row


def run_stream(policy, capacity, chunk, *, delay, causal, steps=14, seed=0):
  rng = np.random.default_rng(seed)
  rows = BATCH * HEADS if policy.per_head else BATCH
  memory = data_only.create(BATCH, capacity, (1,), score_heads=HEADS if policy.per_head else None)
  refs = [PaperMemory(capacity, policy) for _ in range(rows)]
  insert, score = _jitted(policy)
  orders, evictions = set(), [0]

  def do_insert(memory, step):
    positions = 100 + step * chunk + np.arange(chunk, dtype=np.int32)
    row_positions = np.tile(positions, (rows, 1))
    row_valid = rng.random((rows, chunk)) > 0.2
    if policy.per_head:   # the heads of a batch row insert the same tokens
      row_valid = np.repeat(row_valid[::HEADS], HEADS, axis=0)
    new = entries.entries_from_chunk(jnp.asarray(row_positions[..., None], jnp.float32),
                                     jnp.asarray(row_positions), jnp.zeros((rows, chunk), jnp.int32),
                                     jnp.asarray(row_valid))
    memory, evicted = insert(memory, new)
    for r, ref in enumerate(refs):
      expected = ref.insert([int(p) for p in row_positions[r][row_valid[r]]])
      ev = np.asarray(evicted.positions[r])[np.asarray(evicted.valid[r])]
      assert sorted(ev.tolist()) == sorted(expected), (step, r, 'evicted')
      evictions[0] += len(expected)
    return memory

  def do_score(memory, step):
    positions = np.tile(100 + step * chunk - delay + np.arange(chunk, dtype=np.int32), (BATCH, 1))
    valid = rng.random((BATCH, chunk)) > 0.3
    if rng.random() < 0.1:
      valid[rng.integers(BATCH)] = False              # a step of padding only
    weights, mask, per_row = _random_attention(rng, policy, memory, (positions, valid), causal)
    memory = score(memory, weights, jnp.asarray(positions), jnp.asarray(valid), mask)
    for r, ref in enumerate(refs):
      b = r // (rows // BATCH)
      ref.score(list(zip(positions[b].tolist(), valid[b].tolist())), *per_row[r])
    return memory

  for step in range(steps):
    reset = rng.random(BATCH) < 0.15
    memory = _clear(memory, jnp.asarray(np.repeat(reset, rows // BATCH)))
    for r, ref in enumerate(refs):
      if reset[r // (rows // BATCH)]:
        ref.reset()
    order = 'insert_first' if rng.random() < 0.5 else 'attend_first'
    orders.add(order)
    if order == 'insert_first':
      memory = do_score(do_insert(memory, step), step)
    else:
      memory = do_insert(do_score(memory, step), step)
    for r, ref in enumerate(refs):
      contents = _row_contents(memory, r)
      assert sorted(contents) == sorted(ref.scores), (step, r, order)
      for p, (_, s) in contents.items():
        np.testing.assert_allclose(s, ref.scores[p], rtol=1e-4, atol=1e-5,
                                   err_msg=f'step {step} row {r} position {p} ({order})')
  assert orders == {'insert_first', 'attend_first'} and evictions[0] > 0
  return memory, refs


P = policies.EvictionPolicy
# name: (policy, capacity, chunk, delay, causal)
CASES = {
    'fifo': (P('fifo'), 8, 5, 0, True),
    'fifo_chunk_over_capacity': (P('fifo'), 4, 6, 0, True),
    'sink': (P('sink', num_sinks=3), 8, 5, 2, True),
    'sink_recent': (P('sink', num_sinks=2, recent_window=3), 8, 5, 0, False),
    'lru': (P('lru'), 8, 5, 0, True),
    'lru_by_score_recent': (P('lru', admission='score', recent_window=3), 8, 5, 3, True),
    'lfu': (P('lfu'), 8, 5, 0, False),
    'lfu_per_head': (P('lfu', per_head=True), 8, 5, 2, True),
    'lfu_by_score': (P('lfu', admission='score', init_std_multiplier=0.5), 8, 5, 0, True),
    'lra_last': (P('lra', pooling='last'), 8, 5, 3, True),
    'lra_max': (P('lra', pooling='max'), 8, 5, 0, True),
    'lra_sum': (P('lra', pooling='sum', init_std_multiplier=0.5), 8, 5, 7, True),
    'lra_max_by_score': (P('lra', pooling='max', admission='score'), 8, 5, 3, True),
    'lra_last_per_head': (P('lra', pooling='last', per_head=True), 8, 5, 2, True),
    'lra_max_recent': (P('lra', pooling='max', recent_window=4), 8, 5, 0, False),
    'lra_sum_chunk_over_capacity': (P('lra', pooling='sum', admission='score'), 4, 6, 2, True),
    'lfa_0': (P('lfa', gamma=1.0), 8, 5, 0, True),
    'lfa_decay': (P('lfa', gamma=0.9, init_std_multiplier=2.0), 8, 5, 3, True),
    'lfa_decay_by_score_recent': (P('lfa', gamma=0.8, admission='score', recent_window=3),
                                  8, 5, 0, False),
    'lfa_decay_per_head': (P('lfa', gamma=0.9, per_head=True), 8, 5, 2, True),
}

"""Eviction policies and insertion against a brute-force pure-Python memory.

A stream of chunks is inserted into a DataOnlyMemory whose data is a unique
entry id; between inserts the chunk's queries give random attention weights
(or random top-k usage) to the memory slots. A Python reference keeps a
dict id -> (position, score) and applies the documented rules with plain
loops and `sorted`. After every step the kept ids, their scores and the
evicted ids must agree, the memory never holds more than its capacity, and
every inserted id is evicted at most once and is either kept or evicted.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from longformer_jax.attention.attendre import AttendreConfig
from longformer_jax.config.errors import ConfigError
from longformer_jax.memory import data_only, entries, policies

BATCH, HEADS = 2, 2


class ReferenceMemory:
  """One row of memory: id -> [position, score], rules written out in plain Python."""

  def __init__(self, capacity, policy):
    self.capacity, self.policy, self.items = capacity, policy, {}

  def initial_score(self):
    if not self.policy.uses_scores or not self.items:
      return 0.0
    scores = [s for _, s in self.items.values()]
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return mean - self.policy.init_std_multiplier * std

  def insert(self, new_ids, new_positions):
    """Returns the ids evicted."""
    init = self.initial_score()
    candidates = {i: [p, s, False] for i, (p, s) in self.items.items()}
    for i, p in zip(new_ids, new_positions):
      candidates[i] = [p, init, True]
    by_position = sorted(candidates, key=lambda i: candidates[i][0])
    sinks = set(by_position[:self.policy.num_sinks]) if self.policy.name == 'sink' else set()
    window = self.policy.recent_window
    recent = set(by_position[len(by_position) - window:]) if window else set()
    new_entries_compete = self.policy.admission == 'score'

    def keep_priority(i):
      position, score, is_new = candidates[i]
      protected = i in sinks or i in recent
      return (protected, is_new and not new_entries_compete,
              score if self.policy.uses_scores else 0.0, position)
    ranked = sorted(candidates, key=keep_priority)
    overflow = max(0, len(candidates) - self.capacity)
    evicted = ranked[:overflow]
    self.items = {i: candidates[i][:2] for i in ranked[overflow:]}
    return evicted

  def update(self, slot_of, weights, query_positions, query_valid):
    """weights[h][q][slot] (usage 0/1 for lru/lfu); only for rows' own heads."""
    name, queries = self.policy.name, [q for q in range(len(query_valid)) if query_valid[q]]
    heads = range(len(weights))
    for i, (position, score) in self.items.items():
      slot = slot_of[i]
      per_query = {q: sum(weights[h][q][slot] for h in heads) for q in queries}
      if name == 'lfu':
        score += sum(1 for h in heads for q in queries if weights[h][q][slot] > 0)
      elif name == 'lru':
        users = [query_positions[q] for h in heads for q in queries if weights[h][q][slot] > 0]
        score = float(max(users)) if users else score
      elif name == 'lra' and queries:
        if self.policy.pooling == 'sum':
          score = sum(per_query.values())
        elif self.policy.pooling == 'max':
          score = max(per_query.values())
        else:
          score = per_query[max(queries, key=lambda q: query_positions[q])]
      elif name == 'lfa':
        last = max((query_positions[q] for q in queries), default=0)
        score = self.policy.gamma ** len(queries) * score + sum(
            self.policy.gamma ** (last - query_positions[q]) * per_query[q] for q in queries)
      self.items[i] = [position, score]


@jax.jit
def _clear(memory, reset):
  return data_only.clear_rows(memory, reset)


def _jitted(policy):
  insert = jax.jit(lambda m, n: data_only.insert(m, n, policy))
  update = jax.jit(lambda m, w, p, v: policies.update_scores(policy, m, w, p, v))
  return insert, update


def _random_weights(rng, policy, rows_heads, chunk, capacity, top_k=3):
  """`[BATCH, HEADS, chunk, capacity]` softmax weights, or a usage mask for lru/lfu."""
  shape = (BATCH, rows_heads, chunk, capacity)
  if policy.name in ('lru', 'lfu'):
    indices = np.argsort(rng.random(shape), axis=-1)[..., :top_k].astype(np.int32)
    hit_valid = rng.random(indices.shape) > 0.2
    usage = policies.usage_from_topk(jnp.asarray(indices), capacity, jnp.asarray(hit_valid))
    expected = np.zeros(shape, np.float32)
    for index in np.ndindex(indices.shape):
      if hit_valid[index]:
        expected[index[:3] + (indices[index],)] = 1.0
    np.testing.assert_array_equal(np.asarray(usage), expected)
    return usage
  logits = rng.normal(size=shape) * 2
  return jnp.asarray(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True), jnp.float32)


def run_stream(policy, capacity, chunk, steps=10, seed=0):
  rng = np.random.default_rng(seed)
  rows = BATCH * HEADS if policy.per_head else BATCH
  memory = data_only.create(BATCH, capacity, (), jnp.float32,
                            score_heads=HEADS if policy.per_head else None)
  references = [ReferenceMemory(capacity, policy) for _ in range(rows)]
  insert, update = _jitted(policy)
  next_id, inserted, evicted_ids = 1, [set() for _ in range(rows)], [[] for _ in range(rows)]
  for step in range(steps):
    reset = rng.random(BATCH) < 0.15
    memory = _clear(memory, jnp.asarray(np.repeat(reset, rows // BATCH)))
    for r in range(rows):
      if reset[r // (rows // BATCH)]:
        references[r].items = {}
    # The chunk's queries attend to the memory; scores are updated.
    positions = np.tile(np.arange(step * chunk, (step + 1) * chunk), (BATCH, 1)).astype(np.int32)
    valid = rng.random((BATCH, chunk)) > 0.25
    weights = _random_weights(rng, policy, HEADS, chunk, capacity)
    memory = update(memory, weights, jnp.asarray(positions), jnp.asarray(valid))
    slots = np.asarray(memory.data).astype(int)
    memory_valid = np.asarray(memory.valid)
    w = np.asarray(weights)
    for r, ref in enumerate(references):
      b, h = (r // HEADS, r % HEADS) if policy.per_head else (r, None)
      slot_of = {slots[r, j]: j for j in range(capacity) if memory_valid[r, j]}
      row_weights = w[b] if h is None else w[b, h:h + 1]
      ref.update(slot_of, row_weights, positions[b], valid[b])
    # The chunk is inserted; ids are unique per row.
    ids = np.arange(next_id, next_id + rows * chunk).reshape(rows, chunk)
    next_id += rows * chunk
    row_positions = np.repeat(positions, rows // BATCH, axis=0)
    row_valid = np.repeat(valid, rows // BATCH, axis=0)
    new = entries.entries_from_chunk(jnp.asarray(ids, jnp.float32), jnp.asarray(row_positions),
                                     jnp.zeros(row_positions.shape, jnp.int32), jnp.asarray(row_valid))
    memory, evicted = insert(memory, new)
    assert evicted.positions.shape == (rows, chunk)
    assert memory.data.shape == (rows, capacity)
    got_ids, got_valid = np.asarray(memory.data).astype(int), np.asarray(memory.valid)
    got_scores = np.asarray(memory.scores)
    ev_ids, ev_valid = np.asarray(evicted.data).astype(int), np.asarray(evicted.valid)
    for r, ref in enumerate(references):
      new_ids = [int(i) for i, v in zip(ids[r], row_valid[r]) if v]
      expected_evicted = ref.insert(new_ids, [int(p) for p, v in zip(row_positions[r], row_valid[r]) if v])
      kept = [int(i) for i, v in zip(got_ids[r], got_valid[r]) if v]
      assert len(kept) == len(set(kept)) <= capacity
      assert sorted(kept) == sorted(ref.items), (step, r)
      for i, s in zip(got_ids[r], got_scores[r]):
        if int(i) in ref.items:
          np.testing.assert_allclose(s, ref.items[int(i)][1], rtol=1e-4, atol=1e-4)
      row_evicted = [int(i) for i, v in zip(ev_ids[r], ev_valid[r]) if v]
      assert sorted(row_evicted) == sorted(expected_evicted), (step, r)
      evicted_ids[r].extend(row_evicted)
      inserted[r].update(new_ids)
      # Rows reset in this step dropped their old entries; the rest are kept or evicted exactly once.
  for r in range(rows):
    assert len(evicted_ids[r]) == len(set(evicted_ids[r]))
    assert set(evicted_ids[r]) | set(references[r].items) <= inserted[r]
  return memory


POLICIES = {
    'fifo': policies.EvictionPolicy('fifo'),
    'sink': policies.EvictionPolicy('sink', num_sinks=3),
    'lru': policies.EvictionPolicy('lru'),
    'lfu': policies.EvictionPolicy('lfu'),
    'lra_last': policies.EvictionPolicy('lra', pooling='last'),
    'lra_max': policies.EvictionPolicy('lra', pooling='max'),
    'lra_sum': policies.EvictionPolicy('lra', pooling='sum', init_std_multiplier=0.5),
    'lfa_0': policies.EvictionPolicy('lfa', gamma=1.0),
    'lfa_decay': policies.EvictionPolicy('lfa', gamma=0.9, init_std_multiplier=2.0),
    'lra_max_per_head': policies.EvictionPolicy('lra', pooling='max', per_head=True),
    'lfu_per_head': policies.EvictionPolicy('lfu', per_head=True),
    'lra_max_recent': policies.EvictionPolicy('lra', pooling='max', recent_window=6),
    'lfa_decay_recent': policies.EvictionPolicy('lfa', gamma=0.9, recent_window=7),
    'sink_recent': policies.EvictionPolicy('sink', num_sinks=2, recent_window=7),
    'lra_max_by_score': policies.EvictionPolicy('lra', pooling='max', admission='score',
                                                init_std_multiplier=0.5),
    'lfa_decay_by_score': policies.EvictionPolicy('lfa', gamma=0.9, admission='score'),
    'lru_by_score': policies.EvictionPolicy('lru', admission='score', recent_window=3),
    'fifo_by_score': policies.EvictionPolicy('fifo', admission='score'),
}


@pytest.mark.parametrize('name', sorted(POLICIES))
def test_policy_keeps_what_the_python_reference_keeps(name):
  run_stream(POLICIES[name], capacity=8, chunk=5, seed=1)


@pytest.mark.parametrize('name', ['fifo', 'sink', 'lfa_decay', 'lra_max_by_score'])
def test_chunk_longer_than_capacity(name):
  run_stream(POLICIES[name], capacity=4, chunk=6, steps=5, seed=2)


def test_every_entry_evicted_exactly_once_without_resets():
  """With no resets and all entries valid, inserted = kept + evicted, disjointly."""
  policy = policies.EvictionPolicy('lfa', gamma=0.8)
  insert, update = _jitted(policy)
  rng = np.random.default_rng(3)
  capacity, chunk, memory = 16, 6, data_only.create(BATCH, 16, (), jnp.float32)
  evicted_ids, inserted = [], []
  for step in range(12):
    positions = jnp.tile(jnp.arange(step * chunk, (step + 1) * chunk, dtype=jnp.int32), (BATCH, 1))
    memory = update(memory, _random_weights(rng, policy, HEADS, chunk, capacity), positions,
                    jnp.ones((BATCH, chunk), bool))
    ids = np.arange(step * chunk, (step + 1) * chunk) + 1
    new = entries.entries_from_chunk(jnp.tile(jnp.asarray(ids, jnp.float32), (BATCH, 1)), positions,
                                     jnp.zeros_like(positions), jnp.ones((BATCH, chunk), bool))
    memory, evicted = insert(memory, new)
    inserted.extend(ids)
    evicted_ids.extend(int(i) for i, v in zip(np.asarray(evicted.data)[0], np.asarray(evicted.valid)[0]) if v)
    assert int(np.asarray(memory.valid)[0].sum()) == min(capacity, len(inserted))
  kept = [int(i) for i, v in zip(np.asarray(memory.data)[0], np.asarray(memory.valid)[0]) if v]
  assert sorted(evicted_ids + kept) == sorted(inserted)
  assert len(evicted_ids) == len(inserted) - capacity


def test_sinks_keep_the_first_positions_of_each_document():
  insert, _ = _jitted(policies.EvictionPolicy('sink', num_sinks=2))
  memory = data_only.create(1, 5, (), jnp.float32)
  for step in range(4):
    positions = jnp.arange(step * 3, step * 3 + 3, dtype=jnp.int32)[None]
    new = entries.entries_from_chunk(positions.astype(jnp.float32), positions,
                                     jnp.zeros_like(positions), jnp.ones_like(positions, bool))
    memory, _ = insert(memory, new)
  kept = sorted(int(p) for p, v in zip(memory.positions[0], memory.valid[0]) if v)
  assert kept == [0, 1, 9, 10, 11]


@pytest.mark.parametrize('admission, kept_positions', [('always', [4, 5, 6, 7]),
                                                       ('score', [0, 2, 3, 7])])
def test_admission_when_a_chunk_fills_the_memory(admission, kept_positions):
  """M = n = 4. LRA scores [0.9, 0, 0.05, 0.8] at positions 0-3: new entries score
  mean - std = 0.4375 - 0.4144 = 0.0231. 'always' keeps the chunk; 'score' evicts the
  entry scoring 0 and the three oldest new entries (ties: oldest first)."""
  insert, _ = _jitted(policies.EvictionPolicy('lra', admission=admission))
  positions = jnp.arange(4, dtype=jnp.int32)[None]
  memory = data_only.create(1, 4, (), jnp.float32).replace(
      data=positions.astype(jnp.float32), positions=positions, valid=jnp.ones((1, 4), bool),
      scores=jnp.array([[0.9, 0.0, 0.05, 0.8]]))
  new = entries.entries_from_chunk((positions + 4).astype(jnp.float32), positions + 4,
                                   jnp.zeros_like(positions), jnp.ones((1, 4), bool))
  memory, evicted = insert(memory, new)
  assert sorted(int(p) for p in np.asarray(memory.positions)[0]) == kept_positions
  assert sorted(int(p) for p in np.asarray(evicted.positions)[0]) == sorted(
      set(range(8)) - set(kept_positions))


def test_initial_score_is_mean_minus_k_std_of_valid_scores():
  policy = policies.EvictionPolicy('lfa', init_std_multiplier=1.5)
  memory = data_only.create(2, 4, (), jnp.float32)
  memory = memory.replace(scores=jnp.array([[1.0, 2.0, 6.0, 100.0], [0.0] * 4]),
                          valid=jnp.array([[True, True, True, False], [False] * 4]))
  scores = np.asarray(policies.initial_scores(policy, memory))
  np.testing.assert_allclose(scores[0], 3.0 - 1.5 * np.std([1.0, 2.0, 6.0]), rtol=1e-6)
  assert scores[1] == 0.0


def test_eviction_order_ranks_invalid_then_lowest_score_then_oldest():
  policy = policies.EvictionPolicy('lra')
  memory = data_only.create(1, 5, (), jnp.float32).replace(
      scores=jnp.array([[0.5, 0.1, 0.1, 0.9, 0.0]]), positions=jnp.array([[7, 9, 3, 1, 0]]),
      valid=jnp.array([[True, True, True, True, False]]))
  np.testing.assert_array_equal(np.asarray(policies.eviction_order(policy, memory))[0], [4, 2, 1, 0, 3])
  fifo = policies.EvictionPolicy('fifo')
  np.testing.assert_array_equal(np.asarray(policies.eviction_order(fifo, memory))[0], [4, 3, 2, 0, 1])


def test_make_policy_from_the_attendre_section():
  section = AttendreConfig.build(dict(policy='lfa', lfa_gamma=0.5, init_std_multiplier=2.0),
                                 'model.attendre')
  assert policies.make_policy(section) == policies.EvictionPolicy('lfa', gamma=0.5,
                                                                  init_std_multiplier=2.0)
  assert policies.make_policy(AttendreConfig(policy='lra_sum')).pooling == 'sum'
  assert policies.make_policy(AttendreConfig(policy='lra', lra_pooling='last')).pooling == 'last'
  assert policies.make_policy(AttendreConfig()).name == 'fifo'
  assert policies.make_policy(AttendreConfig(policy='lra', recent_window=16)).recent_window == 16
  assert policies.make_policy(AttendreConfig(policy='lfa', admission='score')).admission == 'score'
  assert policies.make_policy(AttendreConfig(per_head_scores=True)).per_head


def test_section_names_the_bad_policy_setting():
  bad = [(dict(policy='lifo'), 'policy'),
         (dict(policy='lra', lra_pooling='mean'), 'lra_pooling'),
         (dict(policy='lfa', lfa_gamma=1.5), 'lfa_gamma'),
         (dict(policy='sink', num_sinks=-1), 'num_sinks'),
         (dict(policy='lra', init_std_multiplier=-1.0), 'init_std_multiplier'),
         (dict(policy='lra', recent_window=-2), 'recent_window'),
         (dict(policy='lra', recent_window=1.5), 'recent_window'),
         (dict(policy='lra', admission='never'), 'admission')]
  for settings, key in bad:
    with pytest.raises(ConfigError) as error:
      AttendreConfig.build(settings, 'model.attendre')
    assert error.value.key == f'model.attendre.{key}'


@pytest.mark.parametrize('name,setting,reads', [
    ('lra', 'lra_pooling', True), ('lra_max', 'lra_pooling', False),
    ('lfa', 'lfa_gamma', True), ('lra_sum', 'lfa_gamma', False),
    ('sink', 'num_sinks', True), ('fifo', 'num_sinks', False),
    ('lru', 'admission', True), ('lra_last', 'init_std_multiplier', True),
    ('sink', 'init_std_multiplier', False), ('fifo', 'recent_window', True)])
def test_which_policy_reads_which_setting(name, setting, reads):
  assert policies.reads_setting(name, setting) is reads


@pytest.mark.parametrize('settings', [dict(name='lifo'), dict(name='lra', pooling='mean'),
                                      dict(name='lfa', gamma=0.0), dict(name='sink', num_sinks=-1),
                                      dict(name='lra', recent_window=1.5),
                                      dict(name='lra', admission='never'),
                                      dict(name='lra', init_std_multiplier=-1.0)])
def test_a_policy_built_in_code_rejects_bad_values(settings):
  with pytest.raises(ValueError, match='EvictionPolicy'):
    policies.EvictionPolicy(**settings)


def test_insert_sorts_once_over_capacity():
  """No [capacity, capacity] intermediate: the insert is a sort, not a pairwise comparison."""
  policy = policies.EvictionPolicy('lfa')
  memory = data_only.create(1, 4096, (2,), jnp.float32)
  positions = jnp.arange(8, dtype=jnp.int32)[None]
  new = entries.entries_from_chunk(jnp.zeros((1, 8, 2)), positions, positions,
                                   jnp.ones((1, 8), bool))
  jaxpr = jax.make_jaxpr(lambda m, n: data_only.insert(m, n, policy))(memory, new)
  sizes = [math.prod(v.aval.shape) for eqn in jaxpr.eqns for v in eqn.outvars]
  assert max(sizes) < 4096 * 64


def test_insert_vmaps_over_stacked_memories():
  """A stack of memories (e.g. scanned layers) inserted under vmap = one insert per memory."""
  policy = policies.EvictionPolicy('lra', pooling='sum')
  rng = np.random.default_rng(4)
  def random_entries(n, start):
    positions = jnp.asarray(np.tile(np.arange(start, start + n), (2, BATCH, 1)), jnp.int32)
    return entries.MemoryEntries(
        data=jnp.asarray(rng.normal(size=(2, BATCH, n, 3)), jnp.float32), positions=positions,
        segment_ids=jnp.zeros_like(positions), valid=jnp.asarray(rng.random((2, BATCH, n)) > 0.2),
        scores=jnp.asarray(rng.random((2, BATCH, n)), jnp.float32))
  stacked, new = random_entries(6, 0), random_entries(4, 6)
  insert_one = jax.jit(lambda m, n: data_only.insert(m, n, policy))
  memories, evicted = jax.jit(jax.vmap(insert_one))(stacked, new)
  for layer in range(2):
    take = lambda tree: jax.tree_util.tree_map(lambda a: a[layer], tree)
    one_memory, one_evicted = insert_one(take(stacked), take(new))
    for got, expected in ((take(memories), one_memory), (take(evicted), one_evicted)):
      jax.tree_util.tree_map(np.testing.assert_array_equal, got, expected)

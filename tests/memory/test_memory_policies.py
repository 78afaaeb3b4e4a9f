"""Eviction policies and insertion: worked cases, ranking, settings and shapes.

Every policy against a plain-Python memory written from the papers'
definitions, through many random chunks: test_policy_reference.py. This
file checks the pieces: every entry evicted exactly once, sinks, admission,
the initial score, the eviction order, the policy's settings from the
Attendre section, and that an insert is one sort and vmaps.
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


def test_usage_from_topk_marks_each_valid_retrieved_slot():
  _random_weights(np.random.default_rng(0), policies.EvictionPolicy('lfu'), HEADS, 5, 8)


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

"""Top-k retrieval from a KeyValueMemory against brute force in float64 numpy.

Covers exact and approximate top-k, scaling, invalid entries (never
returned as valid), k larger than the valid entries or the capacity,
per-head-row memories, the usage mask for LRU/LFU, and the sharded memory:
capacity axis sharded over 8 fake CPU devices returns the same top-k.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from longformer_jax.memory import entries, key_value, policies, sharded_retrieval
from longformer_jax.parallel import sharding

B, Q, H, D, M = 2, 5, 3, 8, 64


def random_memory(seed, capacity=M, valid_fraction=0.7):
  rng = np.random.default_rng(seed)
  keys = rng.normal(size=(B, capacity, H, D)).astype(np.float32)
  values = rng.normal(size=(B, capacity, H, D)).astype(np.float32)
  positions = rng.permutation(capacity * 4)[:capacity][None].repeat(B, 0).astype(np.int32)
  valid = rng.random((B, capacity)) < valid_fraction
  memory = key_value.create(B, capacity, H, D)
  memory = memory.replace(data={'keys': jnp.asarray(keys), 'values': jnp.asarray(values)},
                          positions=jnp.asarray(positions), segment_ids=jnp.asarray(positions % 3),
                          valid=jnp.asarray(valid))
  queries = rng.normal(size=(B, Q, H, D)).astype(np.float32)
  return memory, jnp.asarray(queries)


def brute_force(memory, queries, k, scale=1.0):
  """[(similarity, slot)] best first for every (b, q, h), over valid entries only."""
  keys = np.asarray(memory.data['keys'], np.float64)
  valid = np.asarray(memory.valid)
  queries = np.asarray(queries, np.float64)
  result = {}
  for b in range(B):
    for q in range(queries.shape[1]):
      for h in range(keys.shape[2]):
        scored = [(scale * float(queries[b, q, h] @ keys[b, m, h]), m)
                  for m in range(keys.shape[1]) if valid[b, m]]
        result[b, q, h] = sorted(scored, reverse=True)[:k]
  return result


def check_against_brute_force(memory, queries, retrieved, k, scale=1.0):
  expected = brute_force(memory, queries, k, scale)
  retrieved = jax.tree_util.tree_map(np.asarray, retrieved)
  keys, values = np.asarray(memory.data['keys']), np.asarray(memory.data['values'])
  positions = np.asarray(memory.positions)
  for (b, q, h), best in expected.items():
    n = len(best)
    valid = np.asarray(retrieved.valid[b, q, h])
    assert valid[:n].all() and not valid[n:].any()
    slots = np.asarray(retrieved.indices[b, q, h])[:n]
    assert sorted(slots) == sorted(m for _, m in best)
    np.testing.assert_allclose(np.asarray(retrieved.similarities[b, q, h])[:n],
                               [s for s, _ in best], rtol=1e-5, atol=1e-5)
    assert np.isneginf(np.asarray(retrieved.similarities[b, q, h])[n:]).all()
    np.testing.assert_array_equal(np.asarray(retrieved.keys[b, q, h])[:n], keys[b, slots, h])
    np.testing.assert_array_equal(np.asarray(retrieved.values[b, q, h])[:n], values[b, slots, h])
    np.testing.assert_array_equal(np.asarray(retrieved.positions[b, q, h])[:n], positions[b, slots])


@functools.partial(jax.jit, static_argnames=('k', 'scale', 'method', 'mesh', 'memory_axis',
                                             'batch_axis'))
def retrieve(memory, queries, *, k, scale=None, method='exact', mesh=None, memory_axis=None,
             batch_axis=None):
  return key_value.retrieve(memory, queries, k, scale=scale, method=method, mesh=mesh,
                            memory_axis=memory_axis, batch_axis=batch_axis)


@pytest.mark.parametrize('method', ['exact', 'approx'])
def test_retrieval_equals_brute_force_top_k(method):
  memory, queries = random_memory(0)
  retrieved = retrieve(memory, queries, k=6, scale=0.5, method=method)
  assert retrieved.keys.shape == (B, Q, H, 6, D) and retrieved.valid.shape == (B, Q, H, 6)
  check_against_brute_force(memory, queries, retrieved, 6, scale=0.5)


def test_invalid_entries_are_never_retrieved_and_k_may_exceed_capacity():
  memory, queries = random_memory(1, capacity=8, valid_fraction=0.4)
  retrieved = retrieve(memory, queries, k=11)
  assert retrieved.valid.shape == (B, Q, H, 11)
  check_against_brute_force(memory, queries, retrieved, 11)
  empty = key_value.create(B, 8, H, D)
  assert not np.asarray(retrieve(empty, queries, k=3).valid).any()


def test_per_head_rows_retrieve_the_same_entries():
  memory, queries = random_memory(2)
  per_head = key_value.create(B, M, H, D, per_head_rows=True)
  per_head = per_head.replace(
      data={name: entries.heads_to_rows(leaf) for name, leaf in memory.data.items()},
      positions=entries.repeat_rows(memory.positions, H),
      segment_ids=entries.repeat_rows(memory.segment_ids, H),
      valid=entries.repeat_rows(memory.valid, H))
  assert per_head.data['keys'].shape == (B * H, M, 1, D)
  np.testing.assert_array_equal(entries.rows_to_heads(per_head.data['keys'], H), memory.data['keys'])
  together = retrieve(memory, queries, k=4)
  separately = retrieve(per_head, entries.heads_to_rows(queries), k=4)
  for field in ('indices', 'similarities', 'positions', 'valid'):
    np.testing.assert_array_equal(entries.rows_to_heads(getattr(separately, field), H),
                                  np.asarray(getattr(together, field)))


def test_usage_from_retrieved_marks_exactly_the_valid_hits():
  memory, queries = random_memory(3, capacity=16, valid_fraction=0.3)
  retrieved = retrieve(memory, queries, k=6)
  usage = np.asarray(jax.jit(policies.usage_from_retrieved, static_argnums=1)(retrieved, 16))
  retrieved = jax.tree_util.tree_map(np.asarray, retrieved)
  assert usage.shape == (B, H, Q, 16)
  for b, q, h in np.ndindex(B, Q, H):
    hits = {int(i) for i, v in zip(retrieved.indices[b, q, h], retrieved.valid[b, q, h]) if v}
    assert {int(m) for m in np.flatnonzero(usage[b, h, q])} == hits


def eight_device_mesh():
  return Mesh(np.array(jax.devices()[:8]), ('shards',))


def test_sharded_memory_returns_the_same_top_k():
  assert len(jax.devices()) >= 8, 'tests/conftest.py sets 8 fake CPU devices'
  mesh = eight_device_mesh()
  memory, queries = random_memory(4)
  memory_sharding = NamedSharding(mesh, PartitionSpec(None, 'shards'))
  sharded = jax.tree_util.tree_map(lambda a: jax.device_put(a, memory_sharding), memory)
  assert sharded.data['keys'].sharding.spec == PartitionSpec(None, 'shards')
  for method in ('exact', 'approx'):
    expected = retrieve(memory, queries, k=5, method=method)
    got = retrieve(sharded, queries, k=5, method=method, mesh=mesh, memory_axis='shards')
    for field in ('indices', 'positions', 'valid', 'keys', 'values'):
      np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(expected, field)))
    np.testing.assert_allclose(got.similarities, expected.similarities, rtol=1e-6, atol=1e-6)
    check_against_brute_force(memory, queries, got, 5)


def test_sharded_top_k_with_k_larger_than_a_shard_and_a_2d_mesh():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ('data', 'memory'))
  scores = jnp.asarray(np.random.default_rng(5).normal(size=(4, 3, 32)), jnp.float32)
  values, indices = jax.jit(functools.partial(
      sharded_retrieval.sharded_top_k, k=10, mesh=mesh, memory_axis='memory',
      batch_axis='data'))(scores)
  expected_values, expected_indices = jax.lax.top_k(scores, 10)
  np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected_indices))
  np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
  with pytest.raises(ValueError, match='divisible'):
    sharded_retrieval.sharded_top_k(scores[..., :30], 3, mesh=mesh, memory_axis='memory')


def test_memory_logical_axes_shard_with_the_model():
  memory = key_value.create(B, M, H, D)
  axes = memory.logical_axes()
  assert axes.data == {'keys': ('batch', 'memory', 'heads', 'head_dim'),
                       'values': ('batch', 'memory', 'heads', 'head_dim')}
  assert axes.positions == axes.valid == axes.scores == ('batch', 'memory')
  # The same tree structure as the memory, tuples at the leaves (decoder_lm.state_logical_axes).
  leaves, treedef = jax.tree_util.tree_flatten(memory)
  assert len(treedef.flatten_up_to(axes)) == len(leaves)


def test_weights_to_slots_places_each_retrieved_weight_at_its_slot():
  rng = np.random.default_rng(6)
  indices = np.argsort(rng.random((B, H, Q, 16)), axis=-1)[..., :4].astype(np.int32)
  weights = rng.random((B, H, Q, 4)).astype(np.float32)
  valid = rng.random((B, H, Q, 4)) > 0.3
  slots = np.asarray(policies.weights_to_slots(jnp.asarray(weights), jnp.asarray(indices), 16,
                                               jnp.asarray(valid)))
  expected = np.zeros((B, H, Q, 16), np.float32)
  for b, h, q, j in np.ndindex(indices.shape):
    if valid[b, h, q, j]:
      expected[b, h, q, indices[b, h, q, j]] += weights[b, h, q, j]
  np.testing.assert_allclose(slots, expected)


def test_sharded_retrieval_under_the_model_axis_rules():
  """Batch over 'data', capacity over 'shards', logical rules active (as inside the model)."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ('data', 'shards'))
  memory, queries = random_memory(7)
  expected = retrieve(memory, queries, k=5)
  placed = jax.tree_util.tree_map(
      lambda a: jax.device_put(a, NamedSharding(mesh, PartitionSpec('data', 'shards'))), memory)
  with sharding.activation_sharding(mesh, [('batch', 'data'), ('memory', 'shards')]):
    got = retrieve(placed, queries, k=5, method='approx', mesh=mesh, memory_axis='shards',
                   batch_axis='data')
  np.testing.assert_array_equal(np.asarray(got.indices), np.asarray(expected.indices))
  np.testing.assert_array_equal(np.asarray(got.values), np.asarray(expected.values))

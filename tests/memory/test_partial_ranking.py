"""The first n of a lexicographic order through block minima (memory/partial_ranking.py).

Against the one full sort it replaces, on keys shaped like the eviction
keys (0/1 flags, float scores and int positions full of ties, padding of the
last block); and insertion through the blocked path against the plain-Python
memory of the papers (test_policy_reference.py), with blocks small enough
that the blocked path runs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import partial_ranking, policies
from tests.support.paper_memory import CASES, run_stream


def _full_sort(keys, n):
  slots = jnp.broadcast_to(jnp.arange(keys[0].shape[1], dtype=jnp.int32), keys[0].shape)
  return jax.lax.sort(tuple(keys) + (slots,), dimension=1, num_keys=len(keys) + 1)[-1][:, :n]


def _eviction_like_keys(rng, rows, length):
  """valid, protected, is_new flags; scores with many ties; positions with repeats."""
  flag = lambda p: jnp.asarray(rng.random((rows, length)) < p, jnp.int32)
  scores = jnp.asarray(rng.integers(0, 4, (rows, length)) * 0.5, jnp.float32)
  positions = jnp.asarray(rng.integers(0, length // 3 + 1, (rows, length)), jnp.int32)
  return (flag(0.9), flag(0.1), flag(0.05), scores, positions)


first_in_order = jax.jit(partial_ranking.first_in_order, static_argnums=(1, 2))


@pytest.mark.parametrize('length, n, block', [(1000, 7, 16), (1024, 4, 64), (777, 12, 8),
                                               (300, 40, 4), (50, 20, 4), (64, 1, 1)])
def test_first_n_equal_the_full_sort(length, n, block):
  rng = np.random.default_rng(length + n)
  keys = _eviction_like_keys(rng, 3, length)
  expected = np.asarray(_full_sort(keys, n))
  np.testing.assert_array_equal(np.asarray(first_in_order(keys, n, block)), expected)


def test_the_block_minimum_of_an_all_tied_block_is_its_first_item():
  """Every key equal: the order is the index order, across blocks."""
  keys = (jnp.zeros((2, 500), jnp.int32), jnp.zeros((2, 500), jnp.float32))
  np.testing.assert_array_equal(np.asarray(first_in_order(keys, 5, 8)),
                                np.tile(np.arange(5), (2, 1)))


def test_a_late_small_item_is_found():
  """The smallest item in the last, padded block comes first."""
  positions = jnp.arange(1001, dtype=jnp.int32)[None, ::-1]      # smallest at index 1000
  got = np.asarray(first_in_order((positions,), 3, 16))
  np.testing.assert_array_equal(got, [[1000, 999, 998]])


def test_n_out_of_range_is_refused():
  with pytest.raises(ValueError, match='n = 9'):
    partial_ranking.first_in_order((jnp.zeros((1, 8), jnp.int32),), 9)


@pytest.mark.parametrize('name', ['fifo', 'sink_recent', 'lra_max', 'lfa_decay_by_score_recent',
                                  'lfu_per_head'])
def test_insertion_through_blocks_matches_the_paper_reference(name, monkeypatch):
  """The reference cases with a memory 7x the chunk and blocks of 2 items: every insert
  takes the blocked path (capacity + chunk = 16 items, 8 blocks >= 4 x 2 chosen)."""
  monkeypatch.setattr(partial_ranking, 'DEFAULT_BLOCK', 2)
  policy, _, _, delay, causal = CASES[name]
  run_stream(policy, 14, 2, delay=delay, causal=causal, steps=40,
             seed=sorted(CASES).index(name))


def test_eviction_order_of_a_large_memory_is_unchanged():
  """The whole insert on 2,048 slots (blocked by default) evicts what one sort evicts."""
  from longformer_jax.memory import data_only, entries
  rng = np.random.default_rng(7)
  policy = policies.EvictionPolicy('lra', pooling='max', recent_window=5)
  capacity, n = 2048, 16
  memory = data_only.create(2, capacity, (1,))
  positions = jnp.asarray(rng.permutation(capacity)[None].repeat(2, 0), jnp.int32)
  memory = memory.replace(positions=positions, valid=jnp.asarray(rng.random((2, capacity)) < 0.97),
                          scores=jnp.asarray(rng.integers(0, 3, (2, capacity)), jnp.float32),
                          data=positions[..., None].astype(jnp.float32))
  new_positions = jnp.tile(jnp.arange(capacity, capacity + n, dtype=jnp.int32), (2, 1))
  new = entries.entries_from_chunk(new_positions[..., None].astype(jnp.float32), new_positions,
                                   jnp.zeros_like(new_positions), jnp.ones((2, n), bool))
  _, evicted = jax.jit(lambda m, e: data_only.insert(m, e, policy))(memory, new)
  keys = policies.eviction_keys(policy, memory)
  expected_slots = np.asarray(_full_sort(keys, n))
  np.testing.assert_array_equal(np.asarray(evicted.positions),
                                np.take_along_axis(np.asarray(positions), expected_slots, 1))

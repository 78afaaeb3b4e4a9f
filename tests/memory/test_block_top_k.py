"""Block-maxima top-k (memory/block_top_k.py) against `jax.lax.top_k`: values and indices,
ties included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import sharded_retrieval
from longformer_jax.memory.block_top_k import block_top_k, worth_blocking


def _assert_same_as_lax(scores, k, block):
  values, indices = jax.jit(block_top_k, static_argnums=(1, 2))(scores, k, block)
  want_values, want_indices = jax.lax.top_k(scores, k)
  np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))
  np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
  assert indices.dtype == jnp.int32


@pytest.mark.parametrize('length,k,block', [(4096, 8, 64), (1000, 5, 16), (517, 3, 32)])
def test_random_scores(length, k, block):
  scores = jax.random.normal(jax.random.PRNGKey(length), (2, 3, 7, length))
  _assert_same_as_lax(scores, k, block)


def test_ties_resolve_to_the_smallest_index_like_lax():
  # Few distinct values: most of the top-k are ties, across blocks and within them.
  rng = np.random.default_rng(0)
  scores = jnp.asarray(rng.integers(0, 4, size=(6, 1024)).astype(np.float32))
  _assert_same_as_lax(scores, 20, 16)


def test_invalid_entries_at_minus_infinity():
  # A memory with only a few valid entries: the -inf tail is part of the top-k.
  rng = np.random.default_rng(1)
  scores = np.full((4, 2048), -np.inf, np.float32)
  for row, valid in enumerate((0, 3, 40, 2048)):
    where = rng.choice(2048, valid, replace=False)
    scores[row, where] = rng.normal(size=valid)
  _assert_same_as_lax(jnp.asarray(scores), 8, 32)


def test_fewer_blocks_than_k_falls_back_to_lax():
  scores = jax.random.normal(jax.random.PRNGKey(3), (3, 100))
  _assert_same_as_lax(scores, 10, 32)       # 4 blocks < k


def test_bad_k_is_refused():
  with pytest.raises(ValueError, match='k = 0'):
    block_top_k(jnp.zeros((2, 8)), 0, 4)


def test_gradients_reach_the_chosen_scores():
  scores = jax.random.normal(jax.random.PRNGKey(4), (3, 512))
  weights = jnp.arange(6, dtype=jnp.float32)
  ours = jax.grad(lambda s: (block_top_k(s, 6, 16)[0] * weights).sum())(scores)
  want = jax.grad(lambda s: (jax.lax.top_k(s, 6)[0] * weights).sum())(scores)
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_exact_method_uses_blocks_only_on_long_axes():
  assert worth_blocking(65536, 32) and not worth_blocking(2048, 32)
  scores = jax.random.normal(jax.random.PRNGKey(5), (2, 65536))
  values, indices = sharded_retrieval.top_k(scores, 32, 'exact')
  want_values, want_indices = jax.lax.top_k(scores, 32)
  np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))
  np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))


@pytest.mark.parametrize('length,block', [(4096, 64), (1000, 16)])
def test_a_validity_mask_counts_as_minus_infinity(length, block):
  rng = np.random.default_rng(2)
  scores = jnp.asarray(rng.normal(size=(2, 3, 5, length)).astype(np.float32))
  valid = jnp.asarray(rng.random((2, 1, 1, length)) < 0.3)
  valid = valid.at[1].set(False).at[1, 0, 0, :4].set(True)      # row 1: 4 valid entries
  values, indices = jax.jit(block_top_k, static_argnums=(1, 2))(scores, 8, block, valid)
  want_values, want_indices = jax.lax.top_k(jnp.where(valid, scores, -jnp.inf), 8)
  np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))
  np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))


def test_retrieval_from_a_long_partly_filled_memory_equals_one_top_k():
  from longformer_jax.memory import key_value
  capacity, heads, dim = 8192, 2, 8
  keys, values = jax.random.normal(jax.random.PRNGKey(6), (2, 2, capacity, heads, dim))
  valid = jnp.arange(capacity)[None] < jnp.array([[capacity], [300]])
  memory = key_value.create(2, capacity, heads, dim).replace(
      data={'keys': keys, 'values': values},
      positions=jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (2, capacity)),
      valid=valid)
  queries = jax.random.normal(jax.random.PRNGKey(7), (2, 5, heads, dim))
  assert worth_blocking(capacity, 16)
  got = jax.jit(lambda m, q: key_value.retrieve(m, q, 16, scale=0.5))(memory, queries)
  want_values, want_indices = jax.lax.top_k(key_value.similarities(memory, queries, 0.5), 16)
  np.testing.assert_array_equal(np.asarray(got.indices), np.moveaxis(np.asarray(want_indices), 1, 2))
  np.testing.assert_array_equal(np.asarray(got.similarities),
                                np.moveaxis(np.asarray(want_values), 1, 2))
  assert bool(got.valid.all())

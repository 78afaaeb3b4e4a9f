"""Tile-by-tile top-k retrieval (memory/tiled_top_k.py) against `jax.lax.top_k` over the
whole masked score matrix: indices and values, ties, holes and empty rows, tiles past the
filled part (never read), gradients through `key_value.retrieve`.

Integer keys and queries make every dot product exact, so ties are real ties and the
comparison is exact. Small tiles (monkeypatched) keep the shapes tiny; one case runs the
module's own sizes through `key_value.retrieve`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import key_value, tiled_top_k


def _reference(keys, valid, queries, k, scale):
  scores = jnp.einsum('bqhd,bmhd->bhqm', queries, keys) * scale
  return jax.lax.top_k(jnp.where(valid[:, None, None, :], scores, -jnp.inf), k)


def _integer_memory(rng, b, capacity, h, d, q, valid):
  keys = jnp.asarray(rng.integers(-2, 3, (b, capacity, h, d)), jnp.float32)
  queries = jnp.asarray(rng.integers(-2, 3, (b, q, h, d)), jnp.float32)
  return keys, jnp.asarray(valid), queries


@pytest.fixture
def small_tiles(monkeypatch):
  """Tiles of 64 entries, sub-blocks of 2, blocks of 4 sub-blocks (8 entries)."""
  monkeypatch.setattr(tiled_top_k, 'TILE', 64)
  monkeypatch.setattr(tiled_top_k, 'SUB_BLOCK', 2)
  monkeypatch.setattr(tiled_top_k, 'BLOCK', 4)


def _assert_same(keys, valid, queries, k, scale=0.5):
  got = jax.jit(tiled_top_k.tiled_top_k, static_argnums=(3, 4))(keys, valid, queries, k, scale)
  want = _reference(keys, valid, queries, k, scale)
  np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
  np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))


@pytest.mark.parametrize('k', [1, 5, 12])
def test_equals_lax_top_k_with_ties_and_holes(small_tiles, k):
  """Integer scores (many ties), random holes, one empty row, one row with fewer valid
  entries than k (its tail is -inf, as lax.top_k orders it)."""
  rng = np.random.default_rng(k)
  valid = rng.random((4, 256)) < 0.8
  valid[1] = False
  valid[2] = False
  valid[2, [3, 200]] = True
  _assert_same(*_integer_memory(rng, 4, 256, 2, 3, 5, valid), k)


def test_a_memory_filled_from_empty_is_read_only_as_far_as_it_is_filled(small_tiles):
  """Rows filled to slots 0-69 and 0-9: two tiles of four are read. Invalid slots past them
  hold keys that would win every comparison; they are neither read nor returned."""
  rng = np.random.default_rng(0)
  keys, _, queries = _integer_memory(rng, 2, 256, 2, 3, 4, np.zeros((2, 256), bool))
  keys = keys.at[:, 128:].set(100.0)
  queries = jnp.abs(queries) + 1.0
  valid = np.zeros((2, 256), bool)
  valid[0, :70], valid[1, :10] = True, True
  assert int(tiled_top_k.filled_tiles(jnp.asarray(valid))) == 2
  _assert_same(keys, jnp.asarray(valid), queries, 6)


def test_sizes_that_do_not_tile_are_refused(small_tiles):
  rng = np.random.default_rng(0)
  keys, valid, queries = _integer_memory(rng, 1, 96, 1, 2, 1, np.ones((1, 96), bool))
  with pytest.raises(ValueError, match='M = 96'):
    tiled_top_k.tiled_top_k(keys, valid, queries, 2)


@pytest.mark.parametrize('fills', [(1000, 2000), (3000, 4096)])
def test_retrieve_on_a_long_memory_equals_lax_and_keeps_its_gradients(fills):
  """The module's own sizes (4,096 entries) through key_value.retrieve, half full (the tiled
  path) and full (the whole score matrix): the same entries as lax.top_k; gradients reach
  the memory's keys and values through the gathered entries."""
  capacity, k = 4096, 4
  assert tiled_top_k.worth_tiling(capacity, k)
  rng = np.random.default_rng(5)
  valid = np.arange(capacity)[None].repeat(2, 0) < np.array(fills)[:, None]
  tiled = int(tiled_top_k.filled_tiles(jnp.asarray(valid))) * tiled_top_k.TILE
  assert (tiled <= key_value.TILED_UP_TO * capacity) == (fills[1] == 2000)
  keys, valid, queries = _integer_memory(rng, 2, capacity, 2, 4, 3, valid)
  values = jnp.asarray(rng.normal(size=keys.shape), jnp.float32)
  memory = key_value.create(2, capacity, 2, 4).replace(
      data={'keys': keys, 'values': values}, valid=valid,
      positions=jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (2, capacity)))
  found = jax.jit(lambda m, q: key_value.retrieve(m, q, k, scale=0.25))(memory, queries)
  want_values, want_indices = _reference(keys, valid, queries, k, 0.25)
  np.testing.assert_array_equal(np.asarray(found.indices),
                                np.moveaxis(np.asarray(want_indices), 1, 2))
  np.testing.assert_array_equal(np.asarray(found.similarities),
                                np.moveaxis(np.asarray(want_values), 1, 2))

  def loss(data):
    got = key_value.retrieve(memory.replace(data=data), queries, k, scale=0.25)
    return jnp.sum(got.values) + jnp.sum(got.keys ** 2)
  grads = jax.jit(jax.grad(loss))({'keys': keys, 'values': values})
  hits = np.zeros(values.shape[:3])                   # how often each (row, slot, head) won
  for b, q, h, j in np.ndindex(np.asarray(found.indices).shape):
    hits[b, int(found.indices[b, q, h, j]), h] += 1
  np.testing.assert_allclose(np.asarray(grads['values'])[..., 0], hits)
  np.testing.assert_allclose(np.asarray(grads['keys']), 2 * np.asarray(keys) * hits[..., None])

"""FIFO memory bookkeeping, position-based masks and the masked softmax."""

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.memory import fifo


def entries(batch, n, start, valid=True):
  positions = jnp.tile(jnp.arange(start, start + n, dtype=jnp.int32), (batch, 1))
  return fifo.FifoMemory(values=positions[..., None].astype(jnp.float32) * 10,
                         positions=positions, segment_ids=jnp.zeros_like(positions),
                         valid=jnp.full((batch, n), valid))


@pytest.mark.parametrize('capacity,chunk', [(5, 3), (3, 5), (4, 4), (0, 3)])
def test_fifo_keeps_the_newest_and_returns_each_evicted_entry_once(capacity, chunk):
  memory = fifo.create(2, capacity, (1,))
  inserted, evicted_positions = [], []
  for step in range(4):
    new = entries(2, chunk, step * chunk)
    inserted.extend(range(step * chunk, (step + 1) * chunk))
    memory, evicted = fifo.insert(memory, new)
    assert memory.capacity == capacity and evicted.positions.shape == (2, chunk)
    evicted_positions.extend(int(p) for p, v in zip(evicted.positions[0], evicted.valid[0]) if v)
    contents = fifo.get_all(memory)
    kept = [int(p) for p, v in zip(contents.positions[0], contents.valid[0]) if v]
    assert kept == inserted[-capacity:] if capacity else kept == []
    np.testing.assert_array_equal(np.asarray(memory.values)[0, :, 0][np.asarray(memory.valid)[0]],
                                  np.array(kept) * 10.0)
  # Every inserted entry is either still in memory or was evicted, exactly once.
  assert sorted(evicted_positions + kept) == inserted


def test_clear_rows_invalidates_only_flagged_rows():
  memory, _ = fifo.insert(fifo.create(3, 4, (1,)), entries(3, 4, 0))
  cleared = fifo.clear_rows(memory, jnp.array([False, True, False]))
  np.testing.assert_array_equal(np.asarray(cleared.valid),
                                [[True] * 4, [False] * 4, [True] * 4])


def test_causal_document_mask_matches_python_rule():
  rng = np.random.default_rng(0)
  q_pos = rng.integers(0, 20, (2, 5))
  k_pos = rng.integers(0, 20, (2, 7))
  q_seg, k_seg = rng.integers(0, 2, (2, 5)), rng.integers(0, 2, (2, 7))
  k_valid = rng.random((2, 7)) > 0.3
  for causal in (True, False):
    mask = np.asarray(causal_document_mask(*map(jnp.asarray, (q_pos, q_seg, k_pos, k_seg, k_valid)),
                                           causal=causal))
    for b in range(2):
      for i in range(5):
        for j in range(7):
          expected = (k_valid[b, j] and q_seg[b, i] == k_seg[b, j]
                      and (not causal or k_pos[b, j] <= q_pos[b, i]))
          assert mask[b, i, j] == expected


def test_masked_softmax_zero_rows_and_float32():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(1, 2, 3, 4)), jnp.bfloat16)
  mask = jnp.array([[[True, True, False, False], [False] * 4, [True] * 4]])
  weights = masked_softmax(logits, mask)
  assert weights.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(weights[0, :, 1]), 0.0)       # fully masked: 0, not NaN
  np.testing.assert_allclose(np.asarray(weights.sum(-1))[0, :, [0, 2]], 1.0, rtol=1e-6)
  assert np.asarray(weights[0, :, 0, 2:]).max() == 0.0
  expected = np.exp(np.asarray(logits, np.float32)[0, :, 2])
  np.testing.assert_allclose(np.asarray(weights[0, :, 2]), expected / expected.sum(-1, keepdims=True),
                             rtol=1e-5)

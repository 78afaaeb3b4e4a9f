"""Far recurrences: the marker against a brute-force search, and the subset sums.

The reference looks, for every target, back over the whole row stream for
the last earlier occurrence of its (input, target) pair in the same document,
with no dictionary and no batching: the marker must agree on every target of
every batch, across batch boundaries and document starts.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.far_recurrences import FarRecurrenceMarker
from longformer_jax.data.eval_streams import EvalStreams
from longformer_jax.data.stream_batch import StreamBatch
from longformer_jax.train.lm_objective import subset_sums
from tests.support.far_recurrence_reference import far_by_brute_force

BOS, PAD = 0, 1


def random_documents(seed: int, count: int, vocab: int = 6):
  rng = np.random.default_rng(seed)
  return [rng.integers(2, 2 + vocab, rng.integers(1, 60)).astype(np.int32) for _ in range(count)]


@pytest.mark.parametrize('min_distance', [1, 5, 17])
def test_marker_matches_brute_force_across_batches_and_documents(min_distance):
  streams = EvalStreams(random_documents(min_distance, 12), num_rows=3, chunk_len=8,
                        bos_id=BOS, pad_id=PAD, chunks_per_batch=2)
  batches = list(streams)
  assert len(batches) > 2  # the marker must carry its memory across batches
  marker = FarRecurrenceMarker(3, min_distance)
  marked = np.concatenate([marker.mark(b) for b in batches], axis=1)
  whole = {name: np.concatenate([getattr(b, name) for b in batches], axis=1)
           for name in ('inputs', 'targets', 'segment_ids', 'target_mask')}
  expected = far_by_brute_force(whole['inputs'], whole['targets'], whole['segment_ids'],
                                whole['target_mask'], min_distance)
  np.testing.assert_array_equal(marked, expected)
  assert 0 < expected.sum() < whole['target_mask'].sum()


def test_a_recurrence_is_far_only_beyond_the_distance_and_within_its_document():
  # Two copies of the same document in one row: "5 6" recurs 3 tokens later.
  streams = EvalStreams([np.array([5, 6, 7, 5, 6], np.int32)] * 2, num_rows=1, chunk_len=4,
                        bos_id=BOS, pad_id=PAD)
  batches = list(streams)
  for distance, expected_far in ((2, 1), (3, 0)):
    marker = FarRecurrenceMarker(1, distance)
    far = np.concatenate([marker.mark(b) for b in batches], axis=1)
    # Stream: BOS 5 6 7 5 6 BOS 5 6 7 5 6 BOS; targets at inputs 4 and 10 ("5" -> "6").
    assert far.sum() == 2 * expected_far
    assert far[0, 4] == far[0, 10] == bool(expected_far)


def test_marker_refuses_bad_settings():
  with pytest.raises(ConfigError, match='eval.far_distance'):
    FarRecurrenceMarker(2, 0)
  marker = FarRecurrenceMarker(2, 4)
  rows3 = np.zeros([3, 4], np.int32)
  with pytest.raises(ConfigError, match='data.eval_batch_size'):
    marker.mark(StreamBatch(rows3, rows3, rows3, rows3, rows3.astype(bool), rows3.astype(bool)))


def test_subset_sums_add_only_the_subset():
  rng = np.random.default_rng(0)
  nll = rng.random([2, 8]).astype(np.float32)
  targets = rng.integers(0, 5, [2, 8])
  subset = (rng.random([2, 8]) < 0.4).astype(np.float32)
  token_bytes = np.array([1, 2, 3, 1, 4], np.float32)
  sums = subset_sums(jnp.asarray(nll), jnp.asarray(targets), jnp.asarray(subset),
                     jnp.asarray(token_bytes))
  chosen = subset.astype(bool)
  np.testing.assert_allclose(sums['subset/loss_sum'], nll[chosen].sum(), rtol=1e-6)
  assert sums['subset/tokens'] == chosen.sum()
  assert sums['subset/bytes'] == token_bytes[targets[chosen]].sum()

"""Tests of EvalStreams against a reference built by plain concatenation.

What is checked (g): for every row, the targets with target_mask=True, in
order, are exactly doc_1 + [BOS] + doc_2 + [BOS] + ... + doc_k + [BOS] for
the documents doc_1..doc_k assigned to that row (longest first, equal lengths
in order, each to the row with the fewest tokens so far, ties to the lowest row).
So over all rows every document token is a target exactly once, and each
document is followed by exactly one BOS target (the next document's BOS or
the row's end BOS). Every other target is padding with target_mask=False.
"""

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.eval_streams import EvalStreams
from longformer_jax.data.stream_batch import reset_flags

BOS = 1
PAD = 0
FIELDS = ('inputs', 'targets', 'positions', 'segment_ids', 'doc_start',
          'target_mask')


def make_docs(lengths):
  """Document i is lengths[i] copies of token 2 + i (never BOS or PAD)."""
  return [np.full([n], 2 + i, dtype=np.int32) for i, n in enumerate(lengths)]


def reference_rows(docs, num_rows):
  """Document ids per row, by the longest-first rule, with a plain loop."""
  totals = [0] * num_rows
  rows = [[] for _ in range(num_rows)]
  order = sorted(range(len(docs)), key=lambda i: (-docs[i].size, i))
  for doc_id in order:
    doc = docs[doc_id]
    row = totals.index(min(totals))  # index() picks the lowest row on ties.
    rows[row].append(doc_id)
    totals[row] += doc.size + 1
  return rows


def reference_stream(docs, doc_ids):
  """[BOS] + doc + [BOS] + doc ... + [BOS] (empty for a row without docs)."""
  if not doc_ids:
    return np.zeros([0], dtype=np.int32)
  pieces = [np.concatenate([[BOS], docs[i]]) for i in doc_ids] + [[BOS]]
  return np.concatenate(pieces).astype(np.int32)


def concat_field(batches, field):
  return np.concatenate([getattr(b, field) for b in batches], axis=1)


@pytest.mark.parametrize('lengths,num_rows,chunk_len,chunks_per_batch', [
    ([5, 1, 7, 2, 9, 3, 3], 3, 4, 1),
    ([5, 1, 7, 2, 9, 3, 3], 3, 4, 3),
    ([1, 1, 1], 1, 1, 1),
    ([4, 20, 2], 2, 8, 2),
    ([6, 2], 4, 3, 1),  # More rows than documents: two rows are padding.
])
def test_streams_match_the_reference(lengths, num_rows, chunk_len,
                                     chunks_per_batch):
  docs = make_docs(lengths)
  streams = EvalStreams(docs, num_rows, chunk_len, BOS, PAD,
                        chunks_per_batch=chunks_per_batch)
  batches = list(streams)
  size = chunk_len * chunks_per_batch
  assert len(batches) == len(streams) == streams.num_batches
  assert streams.padded_length == len(batches) * size
  inputs = concat_field(batches, 'inputs')
  targets = concat_field(batches, 'targets')
  mask = concat_field(batches, 'target_mask')
  segments = concat_field(batches, 'segment_ids')
  doc_start = concat_field(batches, 'doc_start')
  positions = concat_field(batches, 'positions')
  # The full stream of a row: all inputs, then the last target.
  full = np.concatenate([inputs, targets[:, -1:]], axis=1)
  np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])

  rows = reference_rows(docs, num_rows)
  for row, doc_ids in enumerate(rows):
    stream = reference_stream(docs, doc_ids)
    np.testing.assert_array_equal(full[row, :stream.size], stream)
    assert (full[row, stream.size:] == PAD).all()
    # (g) The real targets are each document followed by one BOS.
    want_targets = [t for i in doc_ids for t in docs[i].tolist() + [BOS]]
    assert targets[row][mask[row]].tolist() == want_targets
    num_padding = mask.shape[1] - len(want_targets)
    assert mask[row].tolist() == ([True] * len(want_targets) +
                                  [False] * num_padding)
  # Every document token is a real target exactly once: count per document.
  real = targets[mask]
  for doc_id, doc in enumerate(docs):
    assert (real == 2 + doc_id).sum() == doc.size
  assert (real == BOS).sum() == len(docs)
  assert streams.total_target_tokens == sum(n + 1 for n in lengths)
  assert streams.total_target_tokens == mask.sum()

  # Segment ids, positions and document starts, padding included.
  np.testing.assert_array_equal(doc_start, inputs == BOS)
  np.testing.assert_array_equal(np.diff(segments, axis=1), doc_start[:, 1:])
  np.testing.assert_array_equal(
      positions, np.broadcast_to(np.arange(inputs.shape[1]), inputs.shape))
  for row, doc_ids in enumerate(rows):
    # The end BOS (an input only if padding follows it) is segment k after
    # documents 0..k-1, and the padding keeps that segment id.
    end_bos = max(reference_stream(docs, doc_ids).size - 1, 0)
    assert (segments[row, end_bos:] == len(doc_ids)).all()
  for batch in batches:
    assert batch.inputs.shape == (num_rows, size)
    np.testing.assert_array_equal(reset_flags(batch, chunk_len),
                                  batch.doc_start[:, ::chunk_len])


def test_greedy_assignment_breaks_ties_to_the_lowest_row():
  docs = make_docs([3] * 7)
  streams = EvalStreams(docs, 3, 4, BOS, PAD)
  first = next(iter(streams))
  # Equal lengths: documents 0, 1, 2 go to rows 0, 1, 2, then 3, 4, 5 ...
  assert first.inputs[:, 1].tolist() == [2, 3, 4]
  assert reference_rows(docs, 3) == [[0, 3, 6], [1, 4], [2, 5]]


def test_max_tokens_stops_early():
  docs = make_docs([30, 25, 40, 12, 33])
  full = EvalStreams(docs, 2, 8, BOS, PAD)
  per_batch = [int(b.target_mask.sum()) for b in full]
  cumulative = np.cumsum(per_batch)
  limited = EvalStreams(docs, 2, 8, BOS, PAD, max_tokens=50)
  batches = list(limited)
  assert 0 < len(batches) < len(per_batch)
  assert cumulative[len(batches) - 1] >= 50 > cumulative[len(batches) - 2]
  assert limited.total_target_tokens == cumulative[len(batches) - 1]
  assert limited.total_target_tokens == sum(
      b.target_mask.sum() for b in batches)
  big = EvalStreams(docs, 2, 8, BOS, PAD, max_tokens=10**9)
  assert big.num_batches == full.num_batches
  assert big.total_target_tokens == full.total_target_tokens


@pytest.mark.parametrize('max_tokens', [0, 20])
def test_processes_together_serve_the_single_process_batches(max_tokens):
  docs = make_docs([5, 1, 7, 2, 9, 3, 3, 11, 4])
  single = list(EvalStreams(docs, 4, 3, BOS, PAD, chunks_per_batch=2,
                            max_tokens=max_tokens))
  parts = [EvalStreams(docs, 4, 3, BOS, PAD, process_index=p,
                       process_count=2, chunks_per_batch=2,
                       max_tokens=max_tokens) for p in range(2)]
  assert all(p.num_batches == len(single) for p in parts)
  per_process = [list(p) for p in parts]
  for index, want in enumerate(single):
    for field in FIELDS:
      union = np.concatenate([getattr(b[index], field) for b in per_process])
      np.testing.assert_array_equal(union, getattr(want, field), err_msg=field)


def test_bad_settings():
  docs = make_docs([3, 3])
  with pytest.raises(ConfigError) as error:
    EvalStreams(docs, 3, 4, BOS, PAD, process_count=2)
  assert error.value.key == 'data.eval_batch_size'
  with pytest.raises(ConfigError) as error:
    EvalStreams(docs, 2, 0, BOS, PAD)
  assert error.value.key == 'eval.chunk_len'
  with pytest.raises(ConfigError) as error:
    EvalStreams(docs, 2, 4, BOS, PAD, max_tokens=-1)
  assert error.value.key == 'eval.max_tokens'
  with pytest.raises(ValueError, match='no documents'):
    EvalStreams([], 2, 4, BOS, PAD)
  with pytest.raises(IndexError):
    EvalStreams(docs, 2, 4, BOS, PAD).batch_at(99)


def test_longest_documents_are_placed_first_so_rows_end_evenly():
  # In the given order, the long last document would join a row that already
  # holds two short ones (rows of 2+2 and 2+11 tokens); longest first, it has a
  # row of its own and the short ones share the other (11 and 2+2+2).
  docs = make_docs([1, 1, 1, 10])
  streams = EvalStreams(docs, 2, 1, BOS, PAD)
  assert reference_rows(docs, 2) == [[3], [0, 1, 2]]
  assert streams.padded_length == 11   # targets of the longer row: 10 + 1 BOS
  targets = concat_field(list(streams), 'targets')
  mask = concat_field(list(streams), 'target_mask')
  np.testing.assert_array_equal(targets[0][mask[0]], [5] * 10 + [BOS])

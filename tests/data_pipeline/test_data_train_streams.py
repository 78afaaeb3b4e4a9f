"""Tests of TrainStreams, held to an obviously-right reference.

The reference builds each row's stream by plain concatenation, epoch by
epoch: order = default_rng([seed, e]).permutation(n); row r gets
order[r::num_rows]; each document is written as [BOS] + tokens.
"""

import json

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.stream_batch import reset_flags
from longformer_jax.data.stream_batch import StreamBatch
from longformer_jax.data.train_streams import TrainStreams

BOS = 1
FIELDS = ('inputs', 'targets', 'positions', 'segment_ids', 'doc_start',
          'target_mask')


def make_docs(lengths, first_token=2):
  """Document i is `lengths[i]` copies of token first_token + i, so every
  token tells which document it came from (and none is BOS)."""
  return [np.full([n], first_token + i, dtype=np.int32)
          for i, n in enumerate(lengths)]


def random_lengths(num_docs, seed, max_len=9, allow_empty=False):
  rng = np.random.default_rng(seed)
  return rng.integers(0 if allow_empty else 1, max_len + 1, size=num_docs)


def reference_streams(docs, num_rows, seed, min_tokens):
  """Per row: (tokens, segment_ids, doc_ids_per_segment) of its stream,
  built by concatenation until every row has at least min_tokens tokens."""
  tokens = [[] for _ in range(num_rows)]
  segments = [[] for _ in range(num_rows)]
  doc_ids = [[] for _ in range(num_rows)]
  epoch = 0
  while min(len(t) for t in tokens) < min_tokens:
    order = np.random.default_rng([seed, epoch]).permutation(len(docs))
    for row in range(num_rows):
      for doc_id in order[row::num_rows]:
        segment = len(doc_ids[row])
        doc_ids[row].append(int(doc_id))
        piece = [BOS] + docs[doc_id].tolist()
        tokens[row].extend(piece)
        segments[row].extend([segment] * len(piece))
    epoch += 1
  return ([np.array(t) for t in tokens], [np.array(s) for s in segments],
          doc_ids)


def take_batches(streams, num_steps):
  return [streams.next_batch() for _ in range(num_steps)]


def concat_field(batches, field):
  return np.concatenate([getattr(b, field) for b in batches], axis=1)


def assert_batches_equal(a: StreamBatch, b: StreamBatch):
  for field in FIELDS:
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field),
                                  err_msg=field)


@pytest.mark.parametrize('num_docs,num_rows,tokens_per_step,allow_empty', [
    (7, 1, 5, False),
    (10, 3, 1, False),
    (10, 3, 4, True),
    (12, 4, 7, True),
    (5, 5, 3, False),
    (6, 2, 64, True),  # A step spans several epochs of a row.
])
def test_batches_match_the_reference_streams(num_docs, num_rows,
                                             tokens_per_step, allow_empty):
  docs = make_docs(random_lengths(num_docs, seed=num_docs,
                                  allow_empty=allow_empty))
  num_steps = 9
  streams = TrainStreams(docs, num_rows, tokens_per_step, seed=3, bos_id=BOS)
  batches = take_batches(streams, num_steps)
  total = num_steps * tokens_per_step
  ref_tokens, ref_segments, _ = reference_streams(docs, num_rows, 3, total + 1)

  inputs = concat_field(batches, 'inputs')
  targets = concat_field(batches, 'targets')
  for row in range(num_rows):
    # (a) The inputs of consecutive steps are the row's stream; the targets
    # are the same stream shifted by one, across step boundaries too.
    np.testing.assert_array_equal(inputs[row], ref_tokens[row][:total])
    np.testing.assert_array_equal(targets[row], ref_tokens[row][1:total + 1])
    np.testing.assert_array_equal(concat_field(batches, 'segment_ids')[row],
                                  ref_segments[row][:total])
  np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])
  for batch in batches:
    assert batch.inputs.shape == (num_rows, tokens_per_step)
    assert batch.inputs.dtype == np.int32
    assert batch.targets.dtype == np.int32
    assert batch.positions.dtype == np.int32
    assert batch.segment_ids.dtype == np.int32
    assert batch.doc_start.dtype == bool
    assert batch.target_mask.dtype == bool
    assert batch.target_mask.all()
  for previous, following in zip(batches, batches[1:]):
    np.testing.assert_array_equal(previous.targets[:, -1],
                                  following.inputs[:, 0])


def test_every_document_appears_once_per_epoch():
  # (b) Tokens identify documents, so segments can be mapped back to them.
  num_docs, num_rows = 11, 3
  lengths = random_lengths(num_docs, seed=0)
  docs = make_docs(lengths)
  streams = TrainStreams(docs, num_rows, tokens_per_step=8, seed=5,
                         bos_id=BOS)
  num_epochs = 3
  # Enough steps for every row to finish num_epochs epochs.
  max_row_epoch = -(-num_docs // num_rows) * (int(lengths.max()) + 1)
  num_steps = num_epochs * max_row_epoch // 8 + 2
  batches = take_batches(streams, num_steps)
  inputs = concat_field(batches, 'inputs')
  segments = concat_field(batches, 'segment_ids')
  for epoch in range(num_epochs):
    seen = []
    for row in range(num_rows):
      per_epoch = len(range(row, num_docs, num_rows))
      for segment in range(epoch * per_epoch, (epoch + 1) * per_epoch):
        tokens = inputs[row][segments[row] == segment]
        assert tokens[0] == BOS
        content = tokens[1:]
        doc_id = int(content[0]) - 2
        np.testing.assert_array_equal(content, docs[doc_id])
        seen.append(doc_id)
    assert sorted(seen) == list(range(num_docs)), epoch


def test_epochs_are_shuffled_differently():
  docs = make_docs([3] * 20)
  streams = TrainStreams(docs, 2, 4, seed=0, bos_id=BOS)
  assert not np.array_equal(streams.epoch_order(0), streams.epoch_order(1))


def test_same_seed_gives_identical_batches_and_other_seed_differs():
  # (c)
  docs = make_docs(random_lengths(9, seed=1))
  a = take_batches(TrainStreams(docs, 3, 5, seed=7, bos_id=BOS), 6)
  b = take_batches(TrainStreams(docs, 3, 5, seed=7, bos_id=BOS), 6)
  c = take_batches(TrainStreams(docs, 3, 5, seed=8, bos_id=BOS), 6)
  for x, y in zip(a, b):
    assert_batches_equal(x, y)
  assert not all(np.array_equal(x.inputs, z.inputs) for x, z in zip(a, c))


@pytest.mark.parametrize('interrupt_at', [0, 1, 4, 13])
def test_restore_continues_exactly(interrupt_at):
  # (d)
  docs = make_docs(random_lengths(8, seed=2, allow_empty=True))
  uninterrupted = TrainStreams(docs, 2, 6, seed=4, bos_id=BOS)
  expected = take_batches(uninterrupted, interrupt_at + 5)

  first = TrainStreams(docs, 2, 6, seed=4, bos_id=BOS)
  take_batches(first, interrupt_at)
  saved = json.loads(json.dumps(first.state()))
  assert saved['step'] == interrupt_at

  resumed = TrainStreams(docs, 2, 6, seed=4, bos_id=BOS)
  resumed.restore(saved)
  assert resumed.step == interrupt_at
  for batch, want in zip(take_batches(resumed, 5), expected[interrupt_at:]):
    assert_batches_equal(batch, want)


def test_batch_at_is_random_access():
  docs = make_docs(random_lengths(6, seed=3))
  sequential = take_batches(TrainStreams(docs, 2, 5, seed=1, bos_id=BOS), 20)
  fresh = TrainStreams(docs, 2, 5, seed=1, bos_id=BOS)
  for step in (17, 3, 19, 0, 8):
    assert_batches_equal(fresh.batch_at(step), sequential[step])
  assert fresh.step == 0


def test_epoch_layouts_are_built_lazily_and_dropped():
  docs = make_docs([2] * 6)
  streams = TrainStreams(docs, 2, 4, seed=0, bos_id=BOS)
  # A row holds 3 documents of 3 tokens per epoch: 9 tokens.
  streams.next_batch()
  assert streams._epoch_ends.shape[0] == 1  # pylint: disable=protected-access
  take_batches(streams, 40)  # About 18 epochs.
  assert len(streams._epoch_runs_cache) <= 2  # pylint: disable=protected-access


@pytest.mark.parametrize('process_count', [2, 4])
def test_processes_together_serve_the_single_process_batch(process_count):
  # (e)
  docs = make_docs(random_lengths(13, seed=4, allow_empty=True))
  single = take_batches(TrainStreams(docs, 4, 5, seed=2, bos_id=BOS), 7)
  per_process = [
      take_batches(TrainStreams(docs, 4, 5, seed=2, bos_id=BOS,
                                process_index=p,
                                process_count=process_count), 7)
      for p in range(process_count)]
  for step, want in enumerate(single):
    for field in FIELDS:
      union = np.concatenate(
          [getattr(batches[step], field) for batches in per_process])
      np.testing.assert_array_equal(union, getattr(want, field),
                                    err_msg=field)
  for p, batches in enumerate(per_process):
    assert batches[0].num_rows == 4 // process_count, p


def test_segments_positions_and_doc_starts_follow_the_bos_tokens():
  # (f)
  chunk_len = 3
  docs = make_docs(random_lengths(10, seed=6, max_len=5, allow_empty=True))
  streams = TrainStreams(docs, 3, tokens_per_step=2 * chunk_len, seed=0,
                         bos_id=BOS)
  batches = take_batches(streams, 12)
  inputs = concat_field(batches, 'inputs')
  doc_start = concat_field(batches, 'doc_start')
  segments = concat_field(batches, 'segment_ids')
  positions = concat_field(batches, 'positions')
  np.testing.assert_array_equal(doc_start, inputs == BOS)
  np.testing.assert_array_equal(
      positions, np.broadcast_to(np.arange(inputs.shape[1]), inputs.shape))
  assert (segments[:, 0] == 0).all() and doc_start[:, 0].all()
  # The segment id goes up by one exactly at each BOS, across steps.
  np.testing.assert_array_equal(np.diff(segments, axis=1), doc_start[:, 1:])
  for batch in batches:
    flags = reset_flags(batch, chunk_len)
    assert flags.shape == (3, 2) and flags.dtype == bool
    np.testing.assert_array_equal(flags, batch.inputs[:, ::chunk_len] == BOS)
  with pytest.raises(ValueError, match='chunk_len'):
    reset_flags(batches[0], 4)


@pytest.mark.parametrize('key,value', [
    ('seed', 1), ('num_rows', 4), ('tokens_per_step', 6),
    ('num_documents', 9), ('num_tokens', 1000)])
def test_restore_with_other_settings_raises(key, value):
  # (h)
  docs = make_docs(random_lengths(8, seed=7))
  streams = TrainStreams(docs, 2, 5, seed=0, bos_id=BOS)
  streams.next_batch()
  state = streams.state()
  state[key] = value
  fresh = TrainStreams(docs, 2, 5, seed=0, bos_id=BOS)
  with pytest.raises(ValueError, match=key):
    fresh.restore(state)
  assert fresh.step == 0


def test_restore_needs_a_step():
  streams = TrainStreams(make_docs([3, 4]), 2, 5, seed=0, bos_id=BOS)
  with pytest.raises(ValueError, match='step'):
    streams.restore({'seed': 0})


def test_rows_must_split_evenly_over_processes():
  with pytest.raises(ConfigError) as error:
    TrainStreams(make_docs([3] * 8), 6, 4, seed=0, bos_id=BOS,
                 process_index=0, process_count=4)
  assert error.value.key == 'data.batch_size'


def test_needs_a_document_per_row():
  with pytest.raises(ConfigError, match='at least 4 documents') as error:
    TrainStreams(make_docs([3] * 3), 4, 4, seed=0, bos_id=BOS)
  assert error.value.key == 'data.batch_size'


def test_bad_tokens_per_step_and_seed():
  with pytest.raises(ConfigError) as error:
    TrainStreams(make_docs([3] * 3), 1, 0, seed=0, bos_id=BOS)
  assert error.value.key == 'data.chunk_len'
  with pytest.raises(ConfigError) as error:
    TrainStreams(make_docs([3] * 3), 1, 4, seed=-1, bos_id=BOS)
  assert error.value.key == 'seed'

"""Finite evaluation streams: every held-out token scored exactly once.

Documents, longest first, go to the row with the fewest tokens so far (the
longest-processing-time rule: the rows end as evenly as the documents allow,
so little of the batch is padding); each row ends with one extra BOS so that the end of its last document is
predicted; rows are padded with `pad_id` to a common length. Every document
token is a target exactly once, and so is one BOS (or end BOS) after every
document. The stream layout is in `data/stream_batch.py`.
"""

import heapq
from typing import Iterator, Sequence

import numpy as np

from longformer_jax.config.errors import require
from longformer_jax.data.stream_batch import (RowWindow, StreamBatch, as_token_arrays,
                                              check_positions_fit, copy_from_run, local_rows,
                                              make_run, stack_batch)


def _assign_longest_first(lengths: np.ndarray, num_rows: int) -> list[list[int]]:
  """Documents longest first (equal lengths: in their order), each to the row
  with the fewest tokens so far (ties: the lowest row). Returns the document
  indices of each row, in the order they were assigned.

  A document's score does not depend on its row or on what precedes it in
  the row (memory is reset at document starts), only the padding does: with
  documents in their given order, a long document arriving last leaves the
  other rows idle (the built-in validation split: 50% of the batch was
  padding, 42% with this rule, whose bound is the longest document)."""
  heap = [(0, row) for row in range(num_rows)]
  rows = [[] for _ in range(num_rows)]
  for index in np.argsort(-np.asarray(lengths, dtype=np.int64), kind='stable'):
    index = int(index)
    length = lengths[index]
    total, row = heapq.heappop(heap)
    rows[row].append(index)
    heapq.heappush(heap, (total + int(length), row))
  return rows


class EvalStreams:
  """Finite evaluation streams (see module doc); iterate for the batches.

  Row r's stream: [BOS] + doc_a + [BOS] + doc_b + ... + [BOS] (the end BOS),
  then `pad_id` up to a common length: inputs are padded to a multiple of
  T = chunk_len * chunks_per_batch (so every batch has the same shape) and
  one more token is kept for the shifted target. A row with no document is
  all padding. On padding, `target_mask` is False, positions keep counting
  and segment ids stay those of the end BOS.
  """

  def __init__(self, docs: Sequence[np.ndarray], num_rows: int,
               chunk_len: int, bos_id: int, pad_id: int,
               process_index: int = 0, process_count: int = 1,
               chunks_per_batch: int = 1, max_tokens: int = 0):
    """Args:
      docs: tokenized documents, int [n_i] each, without BOS.
      num_rows: global number of rows (`data.eval_batch_size`).
      chunk_len: tokens per chunk.
      bos_id, pad_id: the BOS and padding token ids.
      process_index, process_count: as in `TrainStreams`.
      chunks_per_batch: chunks per batch; T = chunk_len * chunks_per_batch.
      max_tokens: if > 0, stop after the first batch at which the target
        tokens so far (all processes together) reach max_tokens.

    Raises:
      ConfigError: on bad row, chunk or max_tokens settings.
      ValueError: `docs` is empty.
    """
    self.rows = local_rows(num_rows, process_index, process_count,
                            'data.eval_batch_size')
    require(chunk_len >= 1, 'eval.chunk_len', f'must be >= 1, got {chunk_len}')
    require(chunks_per_batch >= 1, 'eval.chunk_len',
            f'chunks per batch must be >= 1, got {chunks_per_batch}')
    require(max_tokens >= 0, 'eval.max_tokens',
            f'must be >= 0, got {max_tokens}')
    if not docs:
      raise ValueError('no documents to evaluate on')
    self.num_rows = int(num_rows)
    self.chunk_len = int(chunk_len)
    self.tokens_per_batch = int(chunk_len * chunks_per_batch)
    self.bos_id = int(bos_id)
    self.pad_id = int(pad_id)
    # The end BOS of a row is an empty document appended to the list.
    self._docs = as_token_arrays(docs) + [np.zeros([0], dtype=np.int32)]
    lengths = np.array([d.size + 1 for d in self._docs], dtype=np.int64)
    row_doc_ids = _assign_longest_first(lengths[:-1], self.num_rows)
    end_bos = len(self._docs) - 1
    runs = [make_run(ids + [end_bos] if ids else [], lengths, 0)
            for ids in row_doc_ids]
    # Targets of row r: stream tokens 1 .. length - 1.
    self._row_targets = np.array([max(run.length - 1, 0) for run in runs],
                                 dtype=np.int64)
    self._local_runs = [runs[row] for row in self.rows]
    self.padded_length = self._round_up(int(self._row_targets.max()))
    check_positions_fit(self.padded_length + 1)
    self._num_batches, self._total_target_tokens = self._batches_to_read(
        max_tokens)

  def _round_up(self, length: int) -> int:
    step = self.tokens_per_batch
    return -(-length // step) * step

  def _batches_to_read(self, max_tokens: int) -> tuple[int, int]:
    """Number of batches to yield and their target tokens (all rows)."""
    num_batches = self.padded_length // self.tokens_per_batch
    starts = np.arange(num_batches, dtype=np.int64) * self.tokens_per_batch
    per_batch = np.clip(self._row_targets[None, :] - starts[:, None], 0,
                        self.tokens_per_batch).sum(axis=1)
    cumulative = np.cumsum(per_batch)
    if max_tokens > 0:
      reached = int(np.searchsorted(cumulative, max_tokens, side='left'))
      num_batches = min(num_batches, reached + 1)
    return num_batches, int(cumulative[num_batches - 1])

  @property
  def num_batches(self) -> int:
    """Batches yielded by iteration (the same on every process)."""
    return self._num_batches

  @property
  def total_target_tokens(self) -> int:
    """Real target tokens in the yielded batches, all processes together."""
    return self._total_target_tokens

  def __len__(self) -> int:
    return self._num_batches

  def __iter__(self) -> Iterator[StreamBatch]:
    for index in range(self._num_batches):
      yield self.batch_at(index)

  def _read_row(self, row: int, begin: int, end: int) -> RowWindow:
    """Stream tokens [begin, end) of local row `row`, padding included."""
    run = self._local_runs[row]
    last_segment = max(run.doc_ids.size - 1, 0)
    window = RowWindow.filled(end - begin, token=self.pad_id,
                               segment=last_segment)
    stop = min(end, run.length)
    if begin < stop:
      copy_from_run(window, 0, run, begin, stop, self._docs, self.bos_id)
    return window

  def batch_at(self, index: int) -> StreamBatch:
    """Batch `index` (0 <= index < the full, untruncated batch count)."""
    size = self.tokens_per_batch
    if not 0 <= index < self.padded_length // size:
      raise IndexError(f'batch {index} is out of range')
    begin = index * size
    windows = [self._read_row(row, begin, begin + size + 1)
               for row in range(self.rows.size)]
    target_positions = np.arange(begin + 1, begin + size + 1)
    local_targets = self._row_targets[self.rows]
    target_mask = target_positions[None, :] <= local_targets[:, None]
    return stack_batch(windows, begin, size, target_mask)

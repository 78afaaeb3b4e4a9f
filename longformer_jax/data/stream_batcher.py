"""Transformer-XL stream batching of tokenized documents.

Each batch row is an independent, continuous stream of documents, each
document written as `[bos_id] + tokens`. A step takes the next T tokens of
every row, so the memory a model carries from one step to the next is the
memory of the same stream. In a row's stream (0-based token index p):

  step s:  inputs  = stream[s*T     : s*T + T]
           targets = stream[s*T + 1 : s*T + T + 1]   (shifted by one, also
                                                      across step boundaries)

Training (`TrainStreams`): infinite streams. Epoch e shuffles the document
order with `np.random.default_rng([seed, e])` and deals the shuffled
documents round-robin to the global rows (row r gets order[r::num_rows]); a
row's stream is its epoch-0 documents, then its epoch-1 documents, and so
on. Every document appears exactly once per epoch, in exactly one row. The
position in the data is just the step number: `state()` / `restore()`.

Evaluation (`EvalStreams`): finite streams. Documents, in the given order,
go to the row with the fewest tokens so far; each row ends with one extra
BOS so that the end of its last document is predicted; rows are padded with
`pad_id` to a common length. Every document token is a target exactly once,
and so is one BOS (or end BOS) after every document.

Multi-process: process p of P serves the global rows
[p * num_rows / P, (p + 1) * num_rows / P); all processes compute the same
document order, so their rows together are the single-process batch.
"""

import dataclasses
import heapq
from typing import Any, Iterator, Sequence

import numpy as np

from longformer_jax.config_errors import require

_INT32_MAX = int(np.iinfo(np.int32).max)
_STATE_KEYS = ('step', 'seed', 'num_rows', 'tokens_per_step',
               'num_documents', 'num_tokens')


@dataclasses.dataclass(frozen=True)
class StreamBatch:
  """One step of `rows` streams, T tokens each; every field is [rows, T].

  Attributes:
    inputs: int32 input token ids.
    targets: int32 next-token ids (the input shifted by one in the stream).
    positions: int32 absolute 0-based position of the input in its stream.
    segment_ids: int32 index of the input's document along its stream
      (0, 1, 2, ...); a document's BOS belongs to that document.
    doc_start: bool, the input is a BOS (a document starts here).
    target_mask: bool, the target is a real token (False on padding).
  """
  inputs: np.ndarray
  targets: np.ndarray
  positions: np.ndarray
  segment_ids: np.ndarray
  doc_start: np.ndarray
  target_mask: np.ndarray

  @property
  def num_rows(self) -> int:
    return self.inputs.shape[0]

  @property
  def num_tokens(self) -> int:
    """T, the tokens per row."""
    return self.inputs.shape[1]


def reset_flags(batch: StreamBatch, chunk_len: int) -> np.ndarray:
  """Whether each chunk starts with a document's BOS.

  Returns:
    bool [rows, T // chunk_len]: `doc_start` at each chunk's first token.

  Raises:
    ValueError: T is not a positive multiple of `chunk_len`.
  """
  if chunk_len <= 0 or batch.num_tokens % chunk_len:
    raise ValueError(f'chunk_len={chunk_len} does not divide the '
                     f'{batch.num_tokens} tokens per row of the batch')
  return np.ascontiguousarray(batch.doc_start[:, ::chunk_len])


# ---- reading streams ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _DocumentRun:
  """Consecutive BOS-prefixed documents of one row: one epoch of a training
  row, or a whole evaluation row.

  Attributes:
    doc_ids: int64 [n], indices into the document list, in stream order.
    ends: int64 [n], cumulative end offsets (in tokens, BOS included) of the
      documents within the run.
    first_segment: segment id of the run's first document in its row.
  """
  doc_ids: np.ndarray
  ends: np.ndarray
  first_segment: int

  @property
  def length(self) -> int:
    return int(self.ends[-1]) if self.ends.size else 0


def _make_run(doc_ids: np.ndarray, lengths: np.ndarray,
              first_segment: int) -> _DocumentRun:
  doc_ids = np.asarray(doc_ids, dtype=np.int64)
  return _DocumentRun(doc_ids=doc_ids, ends=np.cumsum(lengths[doc_ids]),
                      first_segment=first_segment)


@dataclasses.dataclass
class _RowWindow:
  """A slice of one row's stream being filled: tokens, segment ids and
  document-start flags, each [n]."""
  tokens: np.ndarray
  segment_ids: np.ndarray
  doc_start: np.ndarray

  @classmethod
  def filled(cls, size: int, token: int, segment: int) -> '_RowWindow':
    return cls(tokens=np.full([size], token, dtype=np.int32),
               segment_ids=np.full([size], segment, dtype=np.int32),
               doc_start=np.zeros([size], dtype=bool))


def _copy_bos_prefixed(out: np.ndarray, at: int, doc: np.ndarray, first: int,
                       last: int, bos_id: int) -> None:
  """Writes ([bos_id] + doc)[first:last] to out[at : at + last - first]."""
  if first == 0:
    out[at] = bos_id
    at, first = at + 1, 1
  out[at:at + last - first] = doc[first - 1:last - 1]


def _copy_from_run(window: _RowWindow, at: int, run: _DocumentRun,
                   begin: int, end: int, docs: Sequence[np.ndarray],
                   bos_id: int) -> None:
  """Copies run tokens [begin, end) to window slots [at, at + end - begin).

  Requires 0 <= begin < end <= run.length.
  """
  k = int(np.searchsorted(run.ends, begin, side='right'))
  position = begin
  while position < end:
    doc = docs[run.doc_ids[k]]
    doc_end = int(run.ends[k])
    doc_begin = doc_end - doc.size - 1
    stop = min(end, doc_end)
    slot = at + position - begin
    _copy_bos_prefixed(window.tokens, slot, doc, position - doc_begin,
                       stop - doc_begin, bos_id)
    window.segment_ids[slot:slot + stop - position] = run.first_segment + k
    window.doc_start[slot] = position == doc_begin
    position, k = stop, k + 1


def _stack_batch(windows: Sequence[_RowWindow], begin: int, num_tokens: int,
                 target_mask: np.ndarray) -> StreamBatch:
  """Builds the batch of step windows holding stream tokens
  [begin, begin + num_tokens + 1) of each row."""
  tokens = np.stack([w.tokens for w in windows])
  positions = np.arange(begin, begin + num_tokens, dtype=np.int32)
  return StreamBatch(
      inputs=np.ascontiguousarray(tokens[:, :-1]),
      targets=np.ascontiguousarray(tokens[:, 1:]),
      positions=np.tile(positions, (len(windows), 1)),
      segment_ids=np.stack([w.segment_ids[:-1] for w in windows]),
      doc_start=np.stack([w.doc_start[:-1] for w in windows]),
      target_mask=target_mask)


def _as_token_arrays(docs: Sequence[np.ndarray]) -> list[np.ndarray]:
  return [np.asarray(d, dtype=np.int32).reshape(-1) for d in docs]


def _local_rows(num_rows: int, process_index: int, process_count: int,
                key: str) -> np.ndarray:
  """Global indices of the rows served by this process."""
  require(num_rows >= 1, key, f'must be >= 1, got {num_rows}')
  require(process_count >= 1 and 0 <= process_index < process_count, key,
          f'bad process_index={process_index} of '
          f'process_count={process_count}')
  require(num_rows % process_count == 0, key,
          f'{num_rows} rows cannot be split evenly over {process_count} '
          'processes; use a multiple of the process count')
  per_process = num_rows // process_count
  return np.arange(process_index * per_process,
                   (process_index + 1) * per_process)


def _check_positions_fit(end: int) -> None:
  if end > _INT32_MAX:
    raise OverflowError(f'stream position {end} does not fit in int32')


# ---- training streams -----------------------------------------------------


class TrainStreams:
  """Infinite, deterministic, resumable training streams (see module doc).

  Random access by step is cheap: per-row cumulative epoch lengths locate
  the epoch, per-epoch cumulative document ends locate the document
  (`np.searchsorted`); an epoch's layout is built once, when first needed,
  and dropped once every row has moved past it.
  """

  def __init__(self, docs: Sequence[np.ndarray], num_rows: int,
               tokens_per_step: int, seed: int, bos_id: int,
               process_index: int = 0, process_count: int = 1):
    """Args:
      docs: tokenized documents, int [n_i] each, without BOS.
      num_rows: global number of streams (`data.batch_size`).
      tokens_per_step: T, tokens per row per step
        (`data.chunk_len * data.chunks_per_step`).
      seed: non-negative seed of the per-epoch shuffles.
      bos_id: the token written in front of every document.
      process_index, process_count: this process serves global rows
        [process_index * num_rows / process_count, ...) of num_rows.

    Raises:
      ConfigError: num_rows not divisible by process_count, or fewer
        documents than rows ('data.batch_size'); tokens_per_step < 1
        ('data.chunk_len'); seed < 0 ('seed').
    """
    self.rows = _local_rows(num_rows, process_index, process_count,
                            'data.batch_size')
    require(len(docs) >= num_rows, 'data.batch_size',
            f'{num_rows} training rows need at least {num_rows} documents '
            f'(each row gets at least one per epoch) but the split has '
            f'{len(docs)}; lower data.batch_size')
    require(tokens_per_step >= 1, 'data.chunk_len',
            f'tokens per step must be >= 1, got {tokens_per_step}')
    require(int(seed) >= 0, 'seed', f'must be >= 0, got {seed}')
    self.num_rows = int(num_rows)
    self.tokens_per_step = int(tokens_per_step)
    self.seed = int(seed)
    self.bos_id = int(bos_id)
    self._docs = _as_token_arrays(docs)
    self._lengths = np.array([d.size + 1 for d in self._docs], dtype=np.int64)
    # Row i's stream ends after epoch e at _epoch_ends[e, i] (cumulative).
    self._epoch_ends = np.zeros([0, self.rows.size], dtype=np.int64)
    self._epoch_runs_cache: dict[int, list[_DocumentRun]] = {}
    self._step = 0

  @property
  def step(self) -> int:
    """The step `next_batch` returns next."""
    return self._step

  @property
  def num_documents(self) -> int:
    return len(self._docs)

  def epoch_order(self, epoch: int) -> np.ndarray:
    """The shuffled document order of an epoch, int64 [num_documents]."""
    return np.random.default_rng([self.seed, epoch]).permutation(
        len(self._docs))

  def _build_epoch(self, epoch: int) -> list[_DocumentRun]:
    """One run per local row: its documents of this epoch."""
    order = self.epoch_order(epoch)
    runs = []
    for row in self.rows:
      doc_ids = order[row::self.num_rows]
      runs.append(_make_run(doc_ids, self._lengths, epoch * doc_ids.size))
    return runs

  def _epoch_runs(self, epoch: int) -> list[_DocumentRun]:
    if epoch not in self._epoch_runs_cache:
      self._epoch_runs_cache[epoch] = self._build_epoch(epoch)
    return self._epoch_runs_cache[epoch]

  def _extend_epochs_to(self, end: int) -> None:
    """Lays out epochs until every local row's stream has `end` tokens."""
    while not self._epoch_ends.shape[0] or self._epoch_ends[-1].min() < end:
      epoch = self._epoch_ends.shape[0]
      totals = np.array([run.length for run in self._epoch_runs(epoch)],
                        dtype=np.int64)
      previous = self._epoch_ends[-1] if epoch else 0
      self._epoch_ends = np.concatenate(
          [self._epoch_ends, (previous + totals)[None]])

  def _epoch_at(self, row: int, position: int) -> int:
    """The epoch of local row `row` that holds stream token `position`."""
    return int(np.searchsorted(self._epoch_ends[:, row], position,
                               side='right'))

  def _read_row(self, row: int, begin: int, end: int) -> _RowWindow:
    """Stream tokens [begin, end) of local row `row`."""
    window = _RowWindow.filled(end - begin, token=0, segment=0)
    position = begin
    while position < end:
      epoch = self._epoch_at(row, position)
      epoch_begin = int(self._epoch_ends[epoch - 1, row]) if epoch else 0
      stop = min(end, int(self._epoch_ends[epoch, row]))
      run = self._epoch_runs(epoch)[row]
      _copy_from_run(window, position - begin, run, position - epoch_begin,
                     stop - epoch_begin, self._docs, self.bos_id)
      position = stop
    return window

  def _forget_epochs_before(self, epoch: int) -> None:
    for cached in [e for e in self._epoch_runs_cache if e < epoch]:
      del self._epoch_runs_cache[cached]

  def batch_at(self, step: int) -> StreamBatch:
    """The batch of `step` (local rows), without moving `self.step`."""
    if step < 0:
      raise ValueError(f'step must be >= 0, got {step}')
    begin = step * self.tokens_per_step
    end = begin + self.tokens_per_step + 1
    _check_positions_fit(end)
    self._extend_epochs_to(end)
    windows = [self._read_row(row, begin, end)
               for row in range(self.rows.size)]
    self._forget_epochs_before(
        min(self._epoch_at(row, begin) for row in range(self.rows.size)))
    target_mask = np.ones([self.rows.size, self.tokens_per_step], dtype=bool)
    return _stack_batch(windows, begin, self.tokens_per_step, target_mask)

  def next_batch(self) -> StreamBatch:
    """The batch of the current step; advances the step."""
    batch = self.batch_at(self._step)
    self._step += 1
    return batch

  def __iter__(self) -> Iterator[StreamBatch]:
    while True:
      yield self.next_batch()

  def state(self) -> dict[str, int]:
    """JSON-serialisable position in the data, for checkpoints. The same on
    every process (it describes the global streams)."""
    return {
        'step': self._step,
        'seed': self.seed,
        'num_rows': self.num_rows,
        'tokens_per_step': self.tokens_per_step,
        'num_documents': len(self._docs),
        'num_tokens': int(self._lengths.sum()),
    }

  def restore(self, state: dict[str, Any]) -> None:
    """Continues from a `state()`; later batches equal those of an
    uninterrupted run.

    Raises:
      ValueError: `state` lacks 'step', or its seed, rows, tokens per step
        or corpus size (when recorded) differ from this batcher's, so
        resuming would not reproduce the interrupted run's data.
    """
    if 'step' not in state or int(state['step']) < 0:
      raise ValueError(f'data state {state!r} has no valid step')
    current = self.state()
    mismatches = [f'{key}: checkpoint {state[key]!r} vs now {current[key]!r}'
                  for key in _STATE_KEYS[1:]
                  if key in state and int(state[key]) != current[key]]
    if mismatches:
      raise ValueError(
          'cannot resume the training data stream: the checkpoint was '
          'written with different data settings (' + '; '.join(mismatches) +
          '); use the original settings or start a new workdir')
    self._step = int(state['step'])


# ---- evaluation streams ---------------------------------------------------


def _assign_greedily(lengths: np.ndarray, num_rows: int) -> list[list[int]]:
  """Documents in order, each to the row with the fewest tokens so far
  (ties: the lowest row). Returns the document indices of each row."""
  heap = [(0, row) for row in range(num_rows)]
  rows = [[] for _ in range(num_rows)]
  for index, length in enumerate(lengths):
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
    self.rows = _local_rows(num_rows, process_index, process_count,
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
    self._docs = _as_token_arrays(docs) + [np.zeros([0], dtype=np.int32)]
    lengths = np.array([d.size + 1 for d in self._docs], dtype=np.int64)
    row_doc_ids = _assign_greedily(lengths[:-1], self.num_rows)
    end_bos = len(self._docs) - 1
    runs = [_make_run(ids + [end_bos] if ids else [], lengths, 0)
            for ids in row_doc_ids]
    # Targets of row r: stream tokens 1 .. length - 1.
    self._row_targets = np.array([max(run.length - 1, 0) for run in runs],
                                 dtype=np.int64)
    self._local_runs = [runs[row] for row in self.rows]
    self.padded_length = self._round_up(int(self._row_targets.max()))
    _check_positions_fit(self.padded_length + 1)
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

  def _read_row(self, row: int, begin: int, end: int) -> _RowWindow:
    """Stream tokens [begin, end) of local row `row`, padding included."""
    run = self._local_runs[row]
    last_segment = max(run.doc_ids.size - 1, 0)
    window = _RowWindow.filled(end - begin, token=self.pad_id,
                               segment=last_segment)
    stop = min(end, run.length)
    if begin < stop:
      _copy_from_run(window, 0, run, begin, stop, self._docs, self.bos_id)
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
    return _stack_batch(windows, begin, size, target_mask)

"""Infinite, deterministic, resumable training streams (Transformer-XL batching).

Epoch e shuffles the document order with `np.random.default_rng([seed, e])`
and deals the shuffled documents round-robin to the global rows (row r gets
order[r::num_rows]); a row's stream is its epoch-0 documents, then its
epoch-1 documents, and so on. Every document appears exactly once per epoch,
in exactly one row. The position in the data is just the step number:
`state()` / `restore()`. The stream layout is in `data/stream_batch.py`.
"""

from typing import Any, Iterator, Sequence

import numpy as np

from longformer_jax.config.errors import require
from longformer_jax.data.stream_batch import (DocumentRun, RowWindow, StreamBatch,
                                              as_token_arrays, check_positions_fit,
                                              copy_from_run, local_rows, make_run, stack_batch)

STATE_KEYS = ('step', 'seed', 'num_rows', 'tokens_per_step',
               'num_documents', 'num_tokens')


class TrainStreams:
  """Infinite, deterministic, resumable training streams (see module doc).

  Random access by step is cheap: per-row cumulative epoch lengths locate
  the epoch, per-epoch cumulative document ends locate the document
  (`np.searchsorted`); an epoch's layout is built once, when first needed,
  and dropped once every row has moved past it.
  """

  def __init__(self, docs: Sequence[np.ndarray], num_rows: int,
               tokens_per_step: int, seed: int, bos_id: int,
               process_index: int = 0, process_count: int = 1,
               answer_starts: Sequence[int] | None = None,
               answer_masks: Sequence[np.ndarray] | None = None,
               answer_input_id: int | None = None, count_answers_only: bool = True):
    """Args:
      docs: tokenized documents, int [n_i] each, without BOS.
      num_rows: global number of streams (`data.batch_size`).
      tokens_per_step: T, tokens per row per step
        (`data.chunk_len * data.chunks_per_step`).
      seed: non-negative seed of the per-epoch shuffles.
      bos_id: the token written in front of every document.
      process_index, process_count: this process serves global rows
        [process_index * num_rows / process_count, ...) of num_rows.
      answer_starts: per document, the index of its answer's first token;
        a batch's `target_mask` then holds only the answers' tokens
        (`data.loss_on='answer'`). None: every target counts.
      answer_masks: instead of `answer_starts`, per document a bool [n_i]
        mask of its answer tokens (many answers per document, corpus
        collisions): a batch's `target_mask` holds exactly those (unless
        `count_answers_only` is False).
      answer_input_id: with `answer_masks`, the id the inputs hold in place
        of an answer (the model is told no answer); None: the answer itself.
      count_answers_only: with `answer_masks`, False counts every target
        (the answers stay hidden in the inputs).

    Raises:
      ConfigError: num_rows not divisible by process_count, or fewer
        documents than rows ('data.batch_size'); tokens_per_step < 1
        ('data.chunk_len'); seed < 0 ('seed').
    """
    self.rows = local_rows(num_rows, process_index, process_count,
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
    self._docs = as_token_arrays(docs)
    self._lengths = np.array([d.size + 1 for d in self._docs], dtype=np.int64)
    self._answer_starts = None
    if answer_starts is not None:
      self._answer_starts = np.asarray(answer_starts, dtype=np.int64).reshape(-1)
      if self._answer_starts.size != len(self._docs):
        raise ValueError(f'{self._answer_starts.size} answer starts for '
                         f'{len(self._docs)} documents')
    self._answer_masks = None
    if answer_masks is not None:
      if answer_starts is not None:
        raise ValueError('give answer_starts or answer_masks, not both')
      self._answer_masks = [np.asarray(m, dtype=bool).reshape(-1) for m in answer_masks]
      sizes = [(m.size, d.size) for m, d in zip(self._answer_masks, self._docs)]
      if len(self._answer_masks) != len(self._docs) or any(a != b for a, b in sizes):
        raise ValueError(f'{len(self._answer_masks)} answer masks do not match the '
                         f'{len(self._docs)} documents token for token')
    elif answer_input_id is not None:
      raise ValueError('answer_input_id needs answer_masks')
    self._answer_input_id = answer_input_id
    self._count_answers_only = bool(count_answers_only)
    # Row i's stream ends after epoch e at _epoch_ends[e, i] (cumulative).
    self._epoch_ends = np.zeros([0, self.rows.size], dtype=np.int64)
    self._epoch_runs_cache: dict[int, list[DocumentRun]] = {}
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

  def _build_epoch(self, epoch: int) -> list[DocumentRun]:
    """One run per local row: its documents of this epoch."""
    order = self.epoch_order(epoch)
    runs = []
    for row in self.rows:
      doc_ids = order[row::self.num_rows]
      runs.append(make_run(doc_ids, self._lengths, epoch * doc_ids.size))
    return runs

  def _epoch_runs(self, epoch: int) -> list[DocumentRun]:
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

  def _read_row(self, row: int, begin: int, end: int) -> RowWindow:
    """Stream tokens [begin, end) of local row `row`."""
    window = RowWindow.filled(end - begin, token=0, segment=0)
    position = begin
    while position < end:
      epoch = self._epoch_at(row, position)
      epoch_begin = int(self._epoch_ends[epoch - 1, row]) if epoch else 0
      stop = min(end, int(self._epoch_ends[epoch, row]))
      run = self._epoch_runs(epoch)[row]
      copy_from_run(window, position - begin, run, position - epoch_begin,
                     stop - epoch_begin, self._docs, self.bos_id, self._answer_starts,
                     self._answer_masks, self._count_answers_only)
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
    check_positions_fit(end)
    self._extend_epochs_to(end)
    windows = [self._read_row(row, begin, end)
               for row in range(self.rows.size)]
    self._forget_epochs_before(
        min(self._epoch_at(row, begin) for row in range(self.rows.size)))
    # The target of input slot t is stream token t + 1: it counts where that token does.
    target_mask = np.stack([w.counted[1:] for w in windows])
    return stack_batch(windows, begin, self.tokens_per_step, target_mask,
                       self._answer_input_id)

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
                  for key in STATE_KEYS[1:]
                  if key in state and int(state[key]) != current[key]]
    if mismatches:
      raise ValueError(
          'cannot resume the training data stream: the checkpoint was '
          'written with different data settings (' + '; '.join(mismatches) +
          '); use the original settings or start a new workdir')
    self._step = int(state['step'])

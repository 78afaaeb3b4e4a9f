"""A step of stream batches (`StreamBatch`) and the pieces that read streams.

Transformer-XL stream batching: each batch row is an independent,
continuous stream of documents, each document written as `[bos_id] +
tokens`. A step takes the next T tokens of every row, so the memory a model
carries from one step to the next is the memory of the same stream. In a
row's stream (0-based token index p):

  step s:  inputs  = stream[s*T     : s*T + T]
           targets = stream[s*T + 1 : s*T + T + 1]   (shifted by one, also
                                                      across step boundaries)

Training streams are infinite (`data/train_streams.py`); evaluation streams
are finite and padded (`data/eval_streams.py`). Both lay a row out as runs
of consecutive documents (`DocumentRun`) and copy slices of them into
`RowWindow`s, stacked into a `StreamBatch`.

Multi-process: process p of P serves the global rows
[p * num_rows / P, (p + 1) * num_rows / P) (`local_rows`); all processes
compute the same document order, so their rows together are the
single-process batch.
"""


import dataclasses
from typing import Sequence

import numpy as np

from longformer_jax.config.errors import require

INT32_MAX = int(np.iinfo(np.int32).max)


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
class DocumentRun:
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


def make_run(doc_ids: np.ndarray, lengths: np.ndarray,
              first_segment: int) -> DocumentRun:
  doc_ids = np.asarray(doc_ids, dtype=np.int64)
  return DocumentRun(doc_ids=doc_ids, ends=np.cumsum(lengths[doc_ids]),
                      first_segment=first_segment)


@dataclasses.dataclass
class RowWindow:
  """A slice of one row's stream being filled: tokens, segment ids,
  document-start flags, whether each token counts as a target (False
  before a document's answer under `data.loss_on='answer'`) and whether it is
  one of a document's marked answers (`answer_masks`), each [n]."""
  tokens: np.ndarray
  segment_ids: np.ndarray
  doc_start: np.ndarray
  counted: np.ndarray
  answer: np.ndarray

  @classmethod
  def filled(cls, size: int, token: int, segment: int) -> 'RowWindow':
    return cls(tokens=np.full([size], token, dtype=np.int32),
               segment_ids=np.full([size], segment, dtype=np.int32),
               doc_start=np.zeros([size], dtype=bool),
               counted=np.ones([size], dtype=bool),
               answer=np.zeros([size], dtype=bool))


def copy_bos_prefixed(out: np.ndarray, at: int, doc: np.ndarray, first: int,
                       last: int, bos_id: int) -> None:
  """Writes ([bos_id] + doc)[first:last] to out[at : at + last - first]."""
  if first == 0:
    out[at] = bos_id
    at, first = at + 1, 1
  out[at:at + last - first] = doc[first - 1:last - 1]


def copy_from_run(window: RowWindow, at: int, run: DocumentRun,
                   begin: int, end: int, docs: Sequence[np.ndarray],
                   bos_id: int, answer_starts: np.ndarray | None = None,
                   answer_masks: Sequence[np.ndarray] | None = None,
                   count_answers_only: bool = True) -> None:
  """Copies run tokens [begin, end) to window slots [at, at + end - begin).

  With `answer_starts` (int [num_docs], the index of each document's answer's
  first token), a slot counts as a target only from its document's answer on
  (the BOS and the prompt do not); with `answer_masks` (per document, bool [n]:
  the token is an answer) a slot is marked `answer` exactly where its document's
  mask is set, and counts only there unless `count_answers_only` is False;
  without either every slot counts.

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
    copy_bos_prefixed(window.tokens, slot, doc, position - doc_begin,
                       stop - doc_begin, bos_id)
    window.segment_ids[slot:slot + stop - position] = run.first_segment + k
    window.doc_start[slot] = position == doc_begin
    if answer_starts is not None:
      # Slot q of [BOS] + doc holds doc token q - 1: it counts from q - 1 = answer start on.
      first_counted = doc_begin + 1 + int(answer_starts[run.doc_ids[k]])
      window.counted[slot:slot + stop - position] = np.arange(position, stop) >= first_counted
    if answer_masks is not None:
      # Slot q of [BOS] + doc holds doc token q - 1; the BOS (q = 0) is never an answer.
      marked = np.zeros([stop - position], bool)
      copy_bos_prefixed(marked, 0, answer_masks[run.doc_ids[k]], position - doc_begin,
                        stop - doc_begin, False)
      window.answer[slot:slot + stop - position] = marked
      if count_answers_only:
        window.counted[slot:slot + stop - position] = marked
    position, k = stop, k + 1


def stack_batch(windows: Sequence[RowWindow], begin: int, num_tokens: int,
                 target_mask: np.ndarray, answer_input_id: int | None = None) -> StreamBatch:
  """Builds the batch of step windows holding stream tokens
  [begin, begin + num_tokens + 1) of each row. With `answer_input_id`, an input that is a
  marked answer reads as that id (the target still holds the answer)."""
  tokens = np.stack([w.tokens for w in windows])
  positions = np.arange(begin, begin + num_tokens, dtype=np.int32)
  inputs = tokens[:, :-1]
  if answer_input_id is not None:
    inputs = np.where(np.stack([w.answer[:-1] for w in windows]), answer_input_id, inputs)
  return StreamBatch(
      inputs=np.ascontiguousarray(inputs, dtype=np.int32),
      targets=np.ascontiguousarray(tokens[:, 1:]),
      positions=np.tile(positions, (len(windows), 1)),
      segment_ids=np.stack([w.segment_ids[:-1] for w in windows]),
      doc_start=np.stack([w.doc_start[:-1] for w in windows]),
      target_mask=target_mask)


def as_token_arrays(docs: Sequence[np.ndarray]) -> list[np.ndarray]:
  return [np.asarray(d, dtype=np.int32).reshape(-1) for d in docs]


def local_rows(num_rows: int, process_index: int, process_count: int,
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


def check_positions_fit(end: int) -> None:
  if end > INT32_MAX:
    raise OverflowError(f'stream position {end} does not fit in int32')

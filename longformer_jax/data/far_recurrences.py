"""Which targets only far context can predict: bigrams seen last long ago.

A target token `y` read after input token `x` is a *far recurrence* when the
pair (x, y) occurred earlier in the same document, but not within the last
`min_distance` tokens. A model that copies (an induction head: "x was
followed by y before") can predict it only if the earlier occurrence is
still in its context or memory. Scoring these targets alone measures what a
memory keeps from far back, the quantity the Attendre paper's eviction
policies trade for (its TriviaQA answers lie far from the question); the
plain average over all tokens is dominated by local context.

The marker reads evaluation batches in order (`EvalStreams`), one row per
stream, and remembers across batches where each bigram of the current
document occurred last.
"""

import numpy as np

from longformer_jax.config.errors import require
from longformer_jax.data.stream_batch import StreamBatch


class FarRecurrenceMarker:
  """Marks the far recurrences of consecutive batches of the same streams."""

  def __init__(self, num_rows: int, min_distance: int):
    """Args:
      num_rows: rows of every batch (one stream each).
      min_distance: a recurrence is far when the bigram's previous
        occurrence is more than this many tokens back.
    """
    require(min_distance >= 1, 'eval.far_distance', f'must be >= 1, got {min_distance}')
    self.min_distance = int(min_distance)
    self._last_seen = [dict() for _ in range(num_rows)]   # (x, y) -> stream position
    self._segment = [-1] * num_rows

  def mark(self, batch: StreamBatch) -> np.ndarray:
    """`[rows, T]` bool: the target is a far recurrence (and a real target).

    Reads the batch's inputs, targets, positions (absolute in the stream),
    segment ids (the document along the stream) and target mask.
    """
    rows, length = batch.inputs.shape
    require(rows == len(self._last_seen), 'data.eval_batch_size',
            f'the marker was built for {len(self._last_seen)} rows, got a batch of {rows}')
    far = np.zeros([rows, length], dtype=bool)
    for r in range(rows):
      last_seen = self._last_seen[r]
      for t in range(length):
        if batch.segment_ids[r, t] != self._segment[r]:
          self._segment[r] = int(batch.segment_ids[r, t])
          last_seen.clear()
        if not batch.target_mask[r, t]:
          continue
        pair = (int(batch.inputs[r, t]), int(batch.targets[r, t]))
        position = int(batch.positions[r, t])
        previous = last_seen.get(pair)
        far[r, t] = previous is not None and position - previous > self.min_distance
        last_seen[pair] = position
    return far

"""Shuffled, deterministic batches of fixed-size task examples (classification, QA, seq2seq).

Examples are already arrays of one fixed shape each (a dict of numpy arrays
with a leading example axis, including `weight [n]` float32, 1 for a real
example). Epoch e visits them in the order
`np.random.default_rng([seed, e]).permutation(n)`; step s takes the global
example indices s*B .. s*B + B - 1 of the concatenated epochs, so the position
in the data is the step number alone (`state()` / `restore()`, as
`TrainStreams`). Process p of P takes its contiguous share of the rows.
A length curriculum of them is `data/curriculum_streams.CurriculumStreams` over two of these.
"""

from typing import Any

import numpy as np

from longformer_jax.config.errors import require


class TaskBatches:
  """Endless training batches over `arrays` (dict of `[num_examples, ...]`)."""

  def __init__(self, arrays: dict, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1):
    self.arrays = arrays
    self.num_examples = len(next(iter(arrays.values())))
    require(self.num_examples > 0, 'data.corpus', 'the task has no training examples')
    require(batch_size % process_count == 0, 'data.batch_size',
            f'{batch_size} rows cannot be split over {process_count} processes')
    self.batch_size = batch_size
    self.seed = seed
    rows = batch_size // process_count
    self.rows = slice(process_index * rows, (process_index + 1) * rows)
    self._step = 0

  def example_indices(self, step: int) -> np.ndarray:
    """Global example indices of the batch of `step`, int64 `[batch_size]`."""
    flat = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
    epochs, within = np.divmod(flat, self.num_examples)
    orders = {e: np.random.default_rng([self.seed, int(e)]).permutation(self.num_examples)
              for e in np.unique(epochs)}
    return np.array([orders[e][i] for e, i in zip(epochs, within)], dtype=np.int64)

  def batch_at(self, step: int) -> dict:
    """This process's rows of the batch of `step`."""
    indices = self.example_indices(step)[self.rows]
    return {name: value[indices] for name, value in self.arrays.items()}

  def next_batch(self) -> dict:
    batch = self.batch_at(self._step)
    self._step += 1
    return batch

  def state(self) -> dict[str, int]:
    return {'step': self._step, 'seed': self.seed, 'batch_size': self.batch_size,
            'num_examples': self.num_examples}

  def restore(self, state: dict[str, Any]) -> None:
    """Continues from `state()`; raises ValueError when the data settings differ."""
    current = self.state()
    mismatches = [f'{key}: checkpoint {state[key]!r} vs now {current[key]!r}'
                  for key in ('seed', 'batch_size', 'num_examples')
                  if key in state and int(state[key]) != current[key]]
    if mismatches:
      raise ValueError('cannot resume the task data: ' + '; '.join(mismatches))
    self._step = int(state['step'])


def eval_batches(arrays: dict, batch_size: int, max_examples: int = 0):
  """Yields batches of every example once, in order (the first `max_examples` if > 0).

  The last batch is filled up with copies of example 0 whose `weight` is 0,
  so metrics weighted by `weight` count every example exactly once.
  """
  total = len(next(iter(arrays.values())))
  if max_examples:
    total = min(total, max_examples)
  for begin in range(0, total, batch_size):
    indices = np.arange(begin, begin + batch_size)
    num_real = int(min(batch_size, total - begin))
    indices[num_real:] = 0
    batch = {name: value[indices] for name, value in arrays.items()}
    batch['weight'] = np.where(np.arange(batch_size) < num_real, batch['weight'], 0.0
                               ).astype(np.float32)
    yield batch


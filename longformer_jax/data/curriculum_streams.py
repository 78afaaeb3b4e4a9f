"""Training streams that read one set of documents first, then another (a length curriculum).

`CurriculumStreams(first, then, switch)` returns the first `switch` batches
from the streams `first` and every later batch from `then`: two
`TrainStreams` of the same rows and tokens per step, or two
`data/task_batches.TaskBatches` of examples of one shape (task retrieval's
`data.lra_retrieval.curriculum_steps`: short documents padded to `seq_len`,
so the train step compiles once; Pathfinder's `data.pathfinder.curriculum_steps`:
images of shorter paths). `then` starts at its
own beginning, with a BOS in every row, so a memory carried across steps is
reset there like at any document start. Used by corpus passkey
(`data.passkey_curriculum_steps`, data/data_config.py): short documents,
one per chunk, where the model learns to copy the key from its local
context, then the long ones, where only a memory can supply it. The data
position is the number of batches read (`state()`), with both streams'
own positions for the checks `TrainStreams.restore` makes.
"""

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.stream_batch import StreamBatch
from longformer_jax.data.task_batches import TaskBatches
from longformer_jax.data.train_streams import TrainStreams

Batches = TrainStreams | TaskBatches


def require_steps_after(key: str, curriculum_steps: int, num_steps: int, budget: str,
                        then: str) -> None:
  """Refuses a curriculum that leaves no training step for its second stage.

  Raises:
    ConfigError: naming `key`, when `curriculum_steps` >= `num_steps` (read from the
      setting or flag `budget`); `then` says what the second stage reads.
  """
  if curriculum_steps >= num_steps:
    raise ConfigError(key, f'{curriculum_steps} leaves no step of {budget}={num_steps} '
                      f'for {then}')


class CurriculumStreams:
  """`next_batch()`: batch `u` of `first` while u < `switch`, then batch u - switch of `then`."""

  def __init__(self, first: Batches, then: Batches, switch: int):
    if switch < 0:
      raise ValueError(f'switch must be >= 0, got {switch}')
    self.first, self.then, self.switch = first, then, int(switch)
    self._unit = 0

  def next_batch(self) -> StreamBatch | dict:
    streams = self.first if self._unit < self.switch else self.then
    self._unit += 1
    return streams.next_batch()

  def state(self) -> dict:
    return {'unit': self._unit, 'switch': self.switch, 'first': self.first.state(),
            'then': self.then.state()}

  def restore(self, state: dict) -> None:
    """Continues from a `state()`.

    Raises:
      ValueError: `state` is not a curriculum's, or its switch differs from this one's.
    """
    if 'unit' not in state or 'first' not in state or 'then' not in state:
      raise ValueError(f'data state {sorted(state)} was not written by a length curriculum')
    if int(state['switch']) != self.switch:
      raise ValueError(f"switch: checkpoint {state['switch']} vs now {self.switch}")
    self.first.restore(state['first'])
    self.then.restore(state['then'])
    self._unit = int(state['unit'])

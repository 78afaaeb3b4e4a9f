"""The length curriculum of fixed-size-example tasks (data/curriculum_streams.CurriculumStreams
over data/task_batches.TaskBatches), its Retrieval setting
(`data.lra_retrieval.curriculum_steps`) and Pathfinder's (`data.pathfinder.curriculum_steps`)."""

import ml_collections
import numpy as np
import pytest

from configs import lra
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.curriculum_streams import CurriculumStreams
from longformer_jax.data.task_batches import TaskBatches
from longformer_jax.experiment_config import resolve_config
from longformer_jax.tasks.registry import task_for

ROWS = 4


def _arrays(count, value):
  return {'inputs': np.full((count, 3), value, np.int32) + np.arange(count)[:, None],
          'weight': np.ones((count,), np.float32)}


def _batches(count, value):
  return TaskBatches(_arrays(count, value), ROWS, seed=5)


def _equal(a, b):
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_first_batches_then_the_other_examples_from_their_start():
  curriculum = CurriculumStreams(_batches(10, 0), _batches(12, 100), switch=3)
  first, then = _batches(10, 0), _batches(12, 100)
  for _ in range(3):
    _equal(curriculum.next_batch(), first.next_batch())
  for _ in range(4):
    _equal(curriculum.next_batch(), then.next_batch())
  assert curriculum.then.num_examples == 12


@pytest.mark.parametrize('stop', [2, 5])
def test_resume_continues_exactly(stop):
  whole = CurriculumStreams(_batches(10, 0), _batches(12, 100), switch=3)
  expected = [whole.next_batch() for _ in range(8)]
  interrupted = CurriculumStreams(_batches(10, 0), _batches(12, 100), switch=3)
  for _ in range(stop):
    interrupted.next_batch()
  resumed = CurriculumStreams(_batches(10, 0), _batches(12, 100), switch=3)
  resumed.restore(interrupted.state())
  for batch in expected[stop:]:
    _equal(resumed.next_batch(), batch)
  with pytest.raises(ValueError, match='switch'):
    CurriculumStreams(_batches(10, 0), _batches(12, 100), switch=4).restore(interrupted.state())
  with pytest.raises(ValueError, match='curriculum'):
    resumed.restore(_batches(12, 100).state())
  with pytest.raises(ValueError, match='num_examples'):
    CurriculumStreams(_batches(11, 0), _batches(12, 100), switch=3).restore(interrupted.state())


def _retrieval_config(**section):
  values = lra.get_config('retrieval,vanilla,mini')
  values['data']['lra_retrieval'].update(train_examples=48, valid_examples=8, test_examples=8,
                                         **section)
  values['train'].update(num_steps=10)
  return ml_collections.ConfigDict(resolve_config(values))


def test_retrieval_training_reads_short_documents_first():
  config = _retrieval_config(curriculum_steps=2, curriculum_max_bytes=127)
  training = task_for('retrieval').training_task(config)
  assert isinstance(training.batches, CurriculumStreams)
  lengths = [training.batches.next_batch()['input_mask'].sum(axis=-1) for _ in range(4)]
  assert all(1 + 64 <= n.min() and n.max() <= 1 + 127 for n in lengths[:2])   # [CLS] + bytes
  assert all(n.min() >= 1 + 768 for n in lengths[2:])
  assert lengths[0].shape == lengths[2].shape == (config.data.batch_size, 2)


def test_retrieval_curriculum_must_leave_long_steps():
  with pytest.raises(ConfigError, match='data.lra_retrieval.curriculum_steps'):
    task_for('retrieval').training_task(_retrieval_config(curriculum_steps=10))


def _pathfinder_config(**section):
  values = lra.get_config('pathfinder,vanilla,mini')
  values['data']['pathfinder'].update(train_examples=8, valid_examples=4, test_examples=4,
                                      **section)
  values['data'].update(batch_size=4)
  values['train'].update(num_steps=10)
  return ml_collections.ConfigDict(resolve_config(values))


def _rows(arrays):
  return {row.tobytes() for row in arrays['inputs']}


def test_pathfinder_training_reads_short_paths_first():
  config = _pathfinder_config(curriculum_steps=2, curriculum_dashes=3)
  task = task_for('classification')
  training = task.training_task(config)
  assert isinstance(training.batches, CurriculumStreams)
  # The images of the same generator at 3 dashes per path, built without the curriculum.
  short = task.load_arrays(_pathfinder_config(dashes_per_path=3), 'train',
                           task.tokenizer(config.data))
  whole = task.load_arrays(config, 'train', task.tokenizer(config.data))
  assert not _rows(short) & _rows(whole)
  batches = [training.batches.next_batch()['inputs'] for _ in range(4)]
  assert all(row.tobytes() in _rows(short) for batch in batches[:2] for row in batch)
  assert all(row.tobytes() in _rows(whole) for batch in batches[2:] for row in batch)


def test_pathfinder_curriculum_must_leave_steps_and_read_shorter_paths():
  with pytest.raises(ConfigError, match='data.pathfinder.curriculum_steps'):
    task_for('classification').training_task(_pathfinder_config(curriculum_steps=10))
  with pytest.raises(ConfigError, match='data.pathfinder.curriculum_dashes'):
    task_for('classification').training_task(_pathfinder_config(curriculum_steps=2,
                                                            curriculum_dashes=7))

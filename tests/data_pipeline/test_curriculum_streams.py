"""The length curriculum's streams (data/curriculum_streams.py) and its passkey setting."""

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.curriculum_streams import CurriculumStreams
from longformer_jax.data.train_streams import TrainStreams
from tests.support.passkey_data_config import passkey_data

ROWS, TOKENS, BOS = 4, 16, 99


def _docs(lengths, seed):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, 50, n).astype(np.int32) for n in lengths]


def _streams(docs):
  return TrainStreams(docs, ROWS, TOKENS, seed=3, bos_id=BOS)


def _equal(a, b):
  for name in ('inputs', 'targets', 'positions', 'doc_start'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_first_batches_then_the_other_streams_from_their_start():
  short, long = _docs([5, 7, 9, 6, 8, 5], 0), _docs([40, 60, 50, 45], 1)
  curriculum = CurriculumStreams(_streams(short), _streams(long), switch=3)
  plain_short, plain_long = _streams(short), _streams(long)
  for _ in range(3):
    _equal(curriculum.next_batch(), plain_short.next_batch())
  after = curriculum.next_batch()
  _equal(after, plain_long.next_batch())
  assert after.inputs[:, 0].tolist() == [BOS] * ROWS and after.doc_start[:, 0].all()
  for _ in range(4):
    _equal(curriculum.next_batch(), plain_long.next_batch())


@pytest.mark.parametrize('stop', [2, 5])
def test_resume_continues_exactly(stop):
  short, long = _docs([5, 7, 9, 6, 8, 5], 0), _docs([40, 60, 50, 45], 1)
  whole = CurriculumStreams(_streams(short), _streams(long), switch=3)
  batches = [whole.next_batch() for _ in range(8)]
  interrupted = CurriculumStreams(_streams(short), _streams(long), switch=3)
  for _ in range(stop):
    interrupted.next_batch()
  resumed = CurriculumStreams(_streams(short), _streams(long), switch=3)
  resumed.restore(interrupted.state())
  for batch in batches[stop:]:
    _equal(resumed.next_batch(), batch)
  with pytest.raises(ValueError, match='switch'):
    CurriculumStreams(_streams(short), _streams(long), switch=4).restore(interrupted.state())
  with pytest.raises(ValueError, match='curriculum'):
    resumed.restore(_streams(long).state())


def test_curriculum_setting_is_read_only_by_passkey():
  assert passkey_data(128, passkey_curriculum_steps=100).passkey_curriculum_steps == 100
  with pytest.raises(ConfigError, match='config.data.passkey_curriculum_steps'):
    passkey_data(128, passkey_curriculum_steps=-1)


def test_passkey_curriculum_length_is_its_own_setting():
  from longformer_jax.data.corpus import curriculum_documents
  one_chunk = curriculum_documents(passkey_data(128, passkey_max_length=1024,
                                                passkey_curriculum_steps=5))
  assert max(len(d.data) for d in one_chunk) <= 127
  longer = curriculum_documents(passkey_data(128, passkey_max_length=1024,
                                             passkey_curriculum_steps=5,
                                             passkey_curriculum_max_length=300))
  assert 127 < max(len(d.data) for d in longer) <= 300
  with pytest.raises(ConfigError, match='config.data.passkey_curriculum_max_length'):
    passkey_data(128, passkey_max_length=1024, passkey_curriculum_steps=5,
                 passkey_curriculum_max_length=2048)


def test_language_model_task_reads_short_documents_first():
  from longformer_jax.tasks.lm import TASK
  from tests.support.tiny_models import tiny_config
  config = tiny_config(attention='vanilla', mem_len=0)
  config.data.update(corpus='passkey', chunk_len=128, chunks_per_step=1, passkey_max_length=1024,
                     passkey_min_length=512, passkey_curriculum_steps=2)
  task = TASK.training_task(config)
  assert isinstance(task.streams.units, CurriculumStreams)
  for _ in range(2):                  # documents of 128 tokens at most (BOS included)
    assert (task.streams.next_batch(1).doc_start.sum(axis=1) >= 1).all()
  longer = [task.streams.next_batch(1) for _ in range(3)]     # 512-1,024 tokens
  assert all((b.doc_start.sum(axis=1) == 0).any() for b in longer[1:])
  config.data.passkey_curriculum_steps = config.train.num_steps
  with pytest.raises(ConfigError, match='data.passkey_curriculum_steps'):
    TASK.training_task(config)

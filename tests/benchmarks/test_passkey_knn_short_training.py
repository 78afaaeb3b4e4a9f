"""benchmarks/passkey_knn_short_training.py: its configs and its random-retrieval control."""

import numpy as np
import pytest

from benchmarks import passkey_knn_short_training as short
from longformer_jax.memory import key_value


def test_configs_split_the_steps_with_the_curriculum():
  config = short.knn_passkey_config(300, seed=1)
  assert (config.train.num_steps, config.data.passkey_curriculum_steps, config.seed) == (300, 150, 1)
  assert config.data.passkey_max_length == 2048 and config.data.batch_size == 16
  assert config.model.layer_schedule.attention == 'vanilla,memorizing'
  one = short.knn_passkey_config(1, seed=0)
  assert (one.train.num_steps, one.data.passkey_curriculum_steps) == (1, 0)
  assert one.data.passkey_max_length == 127


def _memory():
  """Eight entries of 2 heads x 4 dims, entry i's keys along axis i % 4 (scaled by i + 1)."""
  memory = key_value.create(1, 8, 2, 4, np.float32)
  keys = np.zeros([1, 8, 2, 4], np.float32)
  for i in range(8):
    keys[0, i, :, i % 4] = i + 1
  return memory.replace(data={'keys': keys, 'values': keys}, valid=np.ones([1, 8], bool),
                        positions=np.arange(8, dtype=np.int32)[None])


def test_random_retrieval_ignores_the_queries(monkeypatch):
  monkeypatch.setattr(key_value, 'retrieve', key_value.retrieve)    # restored after the test
  memory = _memory()
  along = lambda axis: np.eye(4, dtype=np.float32)[axis][None, None, None].repeat(2, 2)
  own = [np.asarray(key_value.retrieve(memory, along(a), 2).indices) for a in (0, 1)]
  assert set(own[0].ravel()) == {4, 0} and set(own[1].ravel()) == {5, 1}   # the queries decide
  short.use_random_queries()
  found = [np.asarray(key_value.retrieve(memory, along(a), 2).indices) for a in (0, 1)]
  np.testing.assert_array_equal(found[0], found[1])


@pytest.mark.parametrize('args', [[], ['--root=runs', '--score=runs/knn']])
def test_one_of_training_and_scoring_is_asked_for(monkeypatch, capsys, args):
  monkeypatch.setattr('sys.argv', ['passkey_knn_short_training'] + args)
  with pytest.raises(SystemExit) as exit_status:
    short.main()
  assert exit_status.value.code == 2
  assert 'give one of --root (train and score) and --score (score a run)' in capsys.readouterr().err

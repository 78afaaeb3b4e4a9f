"""train.py and eval.py end to end on a tiny model and the built-in corpus."""

import json
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.config.errors import ConfigError
from longformer_jax.train.loop import NonFiniteLossError
from tests.support.tiny_models import tiny_config
from tests.support.tree_checks import assert_trees_equal


def small_run_config(**train_overrides):
  config = tiny_config(attention='xl')
  config.train.update(eval_every=3, eval_max_tokens=1024)
  config.train.update(**train_overrides)
  config.eval.max_tokens = 2048
  return config


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  state, metrics = train_script.train(small_run_config(), workdir)
  return workdir, jax.device_get(state), metrics


def test_uninterrupted_run_logs_and_checkpoints(uninterrupted):
  workdir, state, metrics = uninterrupted
  assert int(state.step) == 6 and metrics['step'] == 6
  assert np.isfinite(metrics['loss'])
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert [l['step'] for l in lines if l['split'] == 'train'] == [2, 4, 6]
  assert [l['step'] for l in lines if l['split'] == 'valid'] == [3, 6]     # final eval not repeated
  assert metrics['final_valid']['bits_per_byte'] > 0
  assert os.listdir(os.path.join(workdir, 'tensorboard'))
  assert Checkpointer(workdir, 3).all_steps() == [3, 6]
  assert not metrics['preempted']


def test_killed_and_resumed_run_is_bit_identical(uninterrupted, tmp_path):
  _, reference, _ = uninterrupted
  workdir = str(tmp_path)
  first, _ = train_script.train(small_run_config(stop_after_steps=3), workdir)
  assert int(first.step) == 3
  resumed, _ = train_script.train(small_run_config(), workdir)
  resumed = jax.device_get(resumed)
  assert int(resumed.step) == 6
  assert_trees_equal(resumed.params, reference.params)
  assert_trees_equal(resumed.opt_state, reference.opt_state)
  assert_trees_equal(resumed.memory, reference.memory)


def test_sigterm_saves_and_exits_cleanly(tmp_path):
  workdir = str(tmp_path)
  metrics_file = os.path.join(workdir, 'metrics.jsonl')

  def first_line_logged() -> bool:
    # Not the file's existence: the logger creates it before the loop installs its SIGTERM
    # handler, and a SIGTERM in between would end this process.
    return os.path.exists(metrics_file) and os.path.getsize(metrics_file) > 0

  def send_sigterm_after_first_log():
    deadline = time.time() + 300
    while time.time() < deadline and not first_line_logged():
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=send_sigterm_after_first_log, daemon=True).start()
  state, result = train_script.train(small_run_config(num_steps=100000, checkpoint_every=100000),
                                     workdir)
  assert result['preempted']
  stopped_at = int(state.step)
  assert 1 <= stopped_at < 100000
  assert Checkpointer(workdir, 3).latest_step() == stopped_at


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  config = small_run_config(checkpoint_every=1, log_every=1)
  config.optimizer.update(learning_rate=1e30, warmup_steps=0)
  with pytest.raises(NonFiniteLossError, match='at step 2'):
    train_script.train(config, str(tmp_path))
  checkpointer = Checkpointer(str(tmp_path), 3)
  assert checkpointer.all_steps() == [1]


@pytest.mark.parametrize('key,overrides', [
    ('model.attention', {'model.attention': 'nope'}),
    ('parallel.mesh_shape', {'parallel.mesh_shape': (3, 1, 1)}),
    ('optimizer.grad_accum_steps', {'optimizer.grad_accum_steps': 3}),
    ('data.batch_size', {'data.batch_size': 12, 'parallel.mesh_shape': (8, 1, 1)}),
    ('model.num_heads', {'parallel.mesh_shape': (1, 1, 8)}),
    ('model.remat_policy', {'model.remat_policy': 'sometimes'}),
    ('data.tfds_data_dir', {'data.corpus': 'tiny_shakespeare'}),
    ('data.tfds_data_dir', {'data.corpus': 'pg19', 'data.tfds_data_dir': '/nonexistent/dir'}),
    ('data.corpus', {'data.corpus': 'enwik9'}),
])
def test_bad_config_names_the_key(tmp_path, key, overrides):
  config = small_run_config()
  for dotted, value in overrides.items():
    section, name = dotted.split('.')
    config[section][name] = value
  with pytest.raises(ConfigError) as error:
    train_script.train(config, str(tmp_path))
  assert error.value.key == key
  assert key in str(error.value)


def test_eval_writes_metrics_and_plot(uninterrupted, capsys):
  workdir = uninterrupted[0]
  config = small_run_config()
  config.eval.mem_lens = '0,16'
  config.eval.far_distance = 8
  result = eval_script.evaluate_run(config, workdir)
  saved = json.load(open(os.path.join(workdir, 'eval', 'metrics.json')))
  assert saved['checkpoint_step'] == 6
  assert [row['mem_len'] for row in saved['by_mem_len']] == [0, 16]
  for row in saved['by_mem_len']:
    assert 0 < row['bits_per_byte'] < 9
    np.testing.assert_allclose(row['bits_per_token'] * row['tokens'],
                               row['bits_per_byte'] * row['bytes'], rtol=1e-6)
    assert 0 < row['far_tokens'] < row['tokens'] and row['far_bits_per_byte'] > 0
  assert saved['bits_per_byte'] == result['bits_per_byte']
  assert os.path.exists(os.path.join(workdir, 'eval', 'bits_per_byte_vs_mem_len.png'))
  assert '| far bits/byte | far tokens |' in capsys.readouterr().out


def test_eval_of_a_missing_step_lists_the_available_ones(uninterrupted):
  config = small_run_config()
  config.eval.step = 4
  with pytest.raises(FileNotFoundError, match=r'\[3, 6\]'):
    eval_script.evaluate_run(config, uninterrupted[0])


@pytest.mark.slow
def test_vanilla_without_memory_checkpoints_and_resumes(tmp_path):
  """mem_len=0 gives zero-size memory arrays; they must survive checkpoints."""
  config = small_run_config(stop_after_steps=3)
  config.model.update(attention='vanilla', mem_len=0)
  train_script.train(config, str(tmp_path))
  config.train.stop_after_steps = 0
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 6 and np.isfinite(metrics['loss'])
  assert jax.tree_util.tree_leaves(state.memory)[0].shape[1] == 0

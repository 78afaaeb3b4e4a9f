"""The training loop's user-facing behaviour: config.json, SIGTERM status, workdir, logs, progress."""

import io
import json
import os

import pytest

import train as train_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.train import loop
from longformer_jax.train.metrics_logging import ProgressBar
from tests.support.tiny_models import tiny_config
from tests.support.tiny_tasks import trainable_task_config


def lm_config(**train_overrides):
  config = tiny_config(attention='xl')
  config.train.update(eval_every=0, log_every=1, eval_max_tokens=512)
  config.train.update(**train_overrides)
  return config


def read_lines(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]


def test_failed_run_leaves_config_json_alone(tmp_path):
  workdir = str(tmp_path)
  train_script.train(lm_config(num_steps=2, checkpoint_every=2), workdir)
  before = open(os.path.join(workdir, 'config.json')).read()
  config = lm_config(num_steps=2, checkpoint_every=2)
  config.data.batch_size = 4                 # the checkpoint's shapes no longer fit
  with pytest.raises(ConfigError, match='data.batch_size'):
    train_script.train(config, workdir)
  assert open(os.path.join(workdir, 'config.json')).read() == before
  assert not [name for name in os.listdir(workdir) if name.endswith('.tmp')]


@pytest.mark.slow
def test_resuming_an_old_flat_config_json_compares_it_in_todays_layout(tmp_path):
  workdir = str(tmp_path)
  train_script.train(lm_config(num_steps=2, checkpoint_every=2), workdir)
  path = os.path.join(workdir, 'config.json')
  saved = json.load(open(path))
  # As an old run wrote it: XL's clamp_len flat in `model`, with another value.
  saved['model'].pop('xl')
  saved['model']['clamp_len'] = 5
  json.dump(saved, open(path, 'w'))
  with pytest.raises(ConfigError, match='model.xl.clamp_len: saved 5, now -1'):
    train_script.train(lm_config(num_steps=4, checkpoint_every=2), workdir)


def test_workdir_that_is_a_file_is_one_config_error(tmp_path):
  path = tmp_path / 'a_file'
  path.write_text('not a run')
  with pytest.raises(ConfigError) as error:
    train_script.train(lm_config(), str(path))
  assert error.value.key == '--workdir' and str(path) in str(error.value)
  assert '\n' not in str(error.value)


def test_sigterm_exit_status_is_143():
  with pytest.raises(SystemExit) as done:
    train_script.finish({'step': 3, 'preempted': True})
  assert done.value.code == 143
  train_script.finish({'step': 6, 'preempted': False})   # finished: returns, status 0


@pytest.mark.slow
def test_resumed_run_does_not_duplicate_metrics_rows(tmp_path):
  workdir = str(tmp_path)
  # Logs steps 1..4 but saves only at 3 and at its end (4); drop checkpoint 4 to
  # stand for a run killed after logging step 4.
  train_script.train(lm_config(num_steps=6, stop_after_steps=4, checkpoint_every=3), workdir)
  os.rename(os.path.join(workdir, 'checkpoints', '4'), os.path.join(str(tmp_path.parent),
                                                                     f'{tmp_path.name}-4'))
  train_script.train(lm_config(num_steps=6, checkpoint_every=3), workdir)
  steps = [line['step'] for line in read_lines(workdir) if line['split'] == 'train']
  assert steps == [1, 2, 3, 4, 5, 6]


def test_task_progress_shows_loss_and_examples_per_s_to_the_stop_step(tmp_path, capsys):
  config = trainable_task_config('classification')
  config.train.update(num_steps=8, stop_after_steps=4, eval_every=2, log_every=2,
                      checkpoint_every=4, eval_max_examples=16)
  _, metrics = train_script.train(config, str(tmp_path))
  out = capsys.readouterr().out
  progress = [line for line in out.splitlines() if line.startswith('step ')]
  assert progress[0].startswith('step 2/4 | loss ') and ' ex/s | ETA' in progress[0]
  assert not any('bits/tok' in line or 'tok/s' in line for line in progress)
  assert metrics['examples_per_s'] > 0 and 'tokens_per_s' not in metrics
  valid = [line for line in out.splitlines() if line.startswith('valid step ')]
  assert [line.split(':')[0] for line in valid] == ['valid step 2', 'valid step 4']
  assert 'accuracy' in valid[0]


def test_throughput_counts_only_the_window_since_the_last_restart():
  now = [0.0]
  throughput = loop.Throughput(clock=lambda: now[0])
  throughput.add(100)
  now[0] = 50.0                       # compile, then an evaluation: not training
  throughput.restart()
  throughput.add(10)
  throughput.add(10)
  now[0] = 52.0
  assert throughput.rate() == 10.0


def test_progress_bar_of_a_task_has_no_bits_per_token():
  stream = io.StringIO()
  bar = ProgressBar(total_steps=4, stream=stream)
  bar.update(2, loss=0.5, rate=320.0, unit='ex')
  bar.note('valid step 2: accuracy 0.5000')
  assert stream.getvalue().splitlines() == ['step 2/4 | loss 0.5000 | 320 ex/s | ETA ?',
                                            'valid step 2: accuracy 0.5000']


def test_one_line_formats_metrics():
  assert loop.one_line({'loss': 0.5, 'examples': 256.0}) == 'loss 0.5000 | examples 256'

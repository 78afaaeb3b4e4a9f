"""A run's files in a gs:// workdir behave as on disk (a real GCS server on loopback).

tests/support/gcs_server.py starts fake-gcs-server; the code under test talks to it
through gcsfs and tensorstore exactly as it talks to Cloud Storage.
"""

import json
import os
import signal
import subprocess
import sys
import time

import fsspec
import jax
import ml_collections
import pytest

import eval as eval_script
import generate as generate_script
import train as train_script
from longformer_jax.checkpoint.checkpointer import Checkpointer

from longformer_jax.config.errors import ConfigError
from longformer_jax.generation.sampling import SamplingSettings
from longformer_jax.generation.text_generation import generate_text
from longformer_jax.storage import paths
from longformer_jax.train import metrics_logging, run_directory
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.repo_paths import REPO_ROOT
from tests.support.tiny_models import tiny_config
from tests.support.tree_checks import assert_trees_equal


def read_steps(path) -> list:
  return [json.loads(line)['step'] for line in path.read_text().splitlines()]


def test_metrics_resume_drops_the_lines_past_the_checkpoint(gcs_bucket):
  workdir = f'{gcs_bucket}/metrics_run'
  with metrics_logging.MetricsLogger(workdir, resume_step=0) as logger:
    for step in (1, 2, 3, 4):
      logger.write(step, {'loss': 1.0 / step})
  path = paths.as_path(workdir) / 'metrics.jsonl'
  assert read_steps(path) == [1, 2, 3, 4]
  # The run died after step 4 with its checkpoint at step 2: steps 3 and 4 come again.
  with metrics_logging.MetricsLogger(workdir, resume_step=2) as logger:
    logger.write(3, {'loss': 0.3})
  assert read_steps(path) == [1, 2, 3]
  assert json.loads(path.read_text().splitlines()[-1])['loss'] == 0.3
  assert list((paths.as_path(workdir) / 'tensorboard').iterdir())   # event file uploaded


def test_config_json_and_workdir_checks(gcs_bucket):
  workdir = f'{gcs_bucket}/config_run'
  run_directory.check_workdir(workdir)
  run_directory.write_config(ml_collections.ConfigDict({'seed': 3}), workdir)
  assert json.loads((paths.as_path(workdir) / 'config.json').read_text()) == {'seed': 3}
  run_directory.check_workdir(workdir)                 # an existing run folder is fine
  with pytest.raises(ConfigError, match='is an existing file'):
    run_directory.check_workdir(f'{workdir}/config.json')
  with pytest.raises(ConfigError, match='bucket gs://missing-bucket-y does not exist'):
    run_directory.check_workdir('gs://missing-bucket-y/run')


def small_run_config(**train_overrides):
  config = tiny_config(attention='xl')
  config.train.update(eval_every=0, log_every=1, checkpoint_every=3, keep_checkpoints=3)
  config.train.update(**train_overrides)
  return config


@pytest.fixture(scope='module')
def resumed_gcs_run(gcs_bucket, tmp_path_factory):
  """A run on GCS stopped at step 4, step 4's arrays lost, resumed to 6; and the local run."""
  local_run = str(tmp_path_factory.mktemp('local_run'))
  reference, _ = train_script.train(small_run_config(num_steps=6), local_run)
  workdir = f'{gcs_bucket}/life_cycle'
  first, _ = train_script.train(small_run_config(num_steps=6, stop_after_steps=4), workdir)
  assert int(first.step) == 4
  assert Checkpointer(workdir, 3).all_steps() == [3, 4]
  # Step 4's upload breaks off: its array objects are gone, its commit marker stays.
  checkpoints = paths.as_path(workdir) / 'checkpoints'
  filesystem, name = fsspec.core.url_to_fs(os.fspath(checkpoints / '4' / 'state'))
  data_objects = [f for f in filesystem.find(name) if '/d/' in f]
  assert data_objects
  filesystem.rm(data_objects)
  resumed, _ = train_script.train(small_run_config(num_steps=6), workdir)
  return workdir, local_run, jax.device_get(resumed), jax.device_get(reference)


def test_a_gs_run_resumes_bit_identically_and_skips_a_broken_checkpoint(resumed_gcs_run):
  workdir, _, resumed, reference = resumed_gcs_run
  assert int(resumed.step) == 6
  # Resumed from step 3, so steps 4-6 ran again: the same as one uninterrupted run.
  assert_trees_equal(resumed.params, reference.params)
  names = sorted(p.name for p in (paths.as_path(workdir) / 'checkpoints').iterdir())
  assert '4.corrupt' in names, names                     # moved aside, not deleted
  steps = [json.loads(line)['step'] for line in
           (paths.as_path(workdir) / 'metrics.jsonl').read_text().splitlines()]
  assert steps == [1, 2, 3, 4, 5, 6]                      # no duplicate rows after the resume


def test_another_architecture_on_a_used_gs_workdir_is_refused(resumed_gcs_run):
  workdir = resumed_gcs_run[0]
  config_json = paths.as_path(workdir) / 'config.json'
  before = config_json.read_text()
  config = small_run_config(num_steps=8)
  config.model.d_ff = 96
  with pytest.raises(ConfigError, match=r'model.d_ff: cannot resume gs://.*saved 64, now 96'):
    train_script.train(config, workdir)
  assert config_json.read_text() == before


@pytest.mark.slow
def test_eval_and_generate_read_a_gs_run_as_a_local_one(resumed_gcs_run):
  workdir, local_run, _, _ = resumed_gcs_run
  on_gcs = eval_script.evaluate_run(small_run_config(), workdir)
  on_disk = eval_script.evaluate_run(small_run_config(), local_run)
  assert on_gcs['bits_per_byte'] == on_disk['bits_per_byte']
  report = json.loads((paths.as_path(workdir) / 'eval' / 'metrics.json').read_text())
  assert report['checkpoint_step'] == 6 and report['bits_per_byte'] == on_gcs['bits_per_byte']
  texts = []
  for run in (workdir, local_run):
    decoder, tokenizer, step = generate_script.load_decoder(run)
    assert step == 6
    texts.append(generate_text(decoder, tokenizer, 'The ', settings=SamplingSettings(temperature=0),
                               max_new_tokens=8).text)
  assert texts[0] == texts[1]


SMALL_RUN = ['--config=configs/default.py', '--config.model.num_layers=1',
             '--config.model.d_model=32', '--config.model.d_ff=64', '--config.model.num_heads=2',
             '--config.model.head_dim=16', '--config.data.chunk_len=64',
             '--config.data.batch_size=8', '--config.train.eval_every=0',
             '--config.train.log_every=1', '--config.train.checkpoint_every=2']


def start_train(workdir: str, *flags) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, 'train.py', f'--workdir={workdir}', *SMALL_RUN, *flags],
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(workdir: str, process: subprocess.Popen, timeout: float = 300) -> None:
  """Waits until `workdir` holds a finished checkpoint (its commit marker uploaded)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and process.poll() is None:
    if Checkpointer(workdir, 3, async_save=False).all_steps():
      return
    time.sleep(0.5)
  process.kill()
  raise AssertionError(f'no checkpoint in {workdir}: {process.communicate()[1][-2000:]}')


@pytest.mark.slow
def test_the_command_line_life_cycle_on_gcs(gcs_bucket):
  """train.py killed with SIGKILL resumes; SIGTERM saves and exits with status 143; a missing
  bucket is one line with status 2 and writes nothing."""
  workdir = f'{gcs_bucket}/command_line'
  run = start_train(workdir, '--config.train.num_steps=100000')
  wait_for_checkpoint(workdir, run)
  run.send_signal(signal.SIGKILL)
  run.communicate()
  killed_at = Checkpointer(workdir, 3, async_save=False).latest_step()
  resumed = subprocess.run([sys.executable, 'train.py', f'--workdir={workdir}', *SMALL_RUN,
                            f'--config.train.num_steps={killed_at + 2}'], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  steps = [json.loads(line)['step'] for line in
           (paths.as_path(workdir) / 'metrics.jsonl').read_text().splitlines()]
  assert steps == list(range(1, killed_at + 3))           # each step once, across the kill

  preempted_dir = f'{gcs_bucket}/sigterm'
  run = start_train(preempted_dir, '--config.train.num_steps=100000')
  wait_for_checkpoint(preempted_dir, run)
  run.send_signal(signal.SIGTERM)
  _, stderr = run.communicate(timeout=300)
  assert run.returncode == train_script.PREEMPTED_EXIT_STATUS, stderr[-2000:]
  stopped = Checkpointer(preempted_dir, 3, async_save=False).latest_step()
  last_logged = json.loads(
      (paths.as_path(preempted_dir) / 'metrics.jsonl').read_text().splitlines()[-1])['step']
  assert stopped == last_logged, (stopped, last_logged, stderr[-3000:])  # saved where it stopped

  bad = subprocess.run([sys.executable, 'train.py', '--workdir=gs://no-such-bucket-q/run',
                        *SMALL_RUN], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1] == (
      'error: --workdir: gs://no-such-bucket-q/run: bucket gs://no-such-bucket-q does not exist '
      '(create it with `gcloud storage buckets create gs://no-such-bucket-q`)')
  assert 'Traceback' not in bad.stderr

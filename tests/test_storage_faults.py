"""A storage that fails mid-run: one clear message naming the operation, the path and the
cause (longformer_jax/storage/storage_errors.py), cleanup failures that never replace it
(train/loop.py `clean_up`), and the same words from train.py and eval.py for a missing
bucket. The outage itself is a real GCS server (tests/gcs_server.py) killed under a
running train.py."""

import logging
import os
import subprocess
import sys
import tempfile
import time

import aiohttp
import pytest

from longformer_jax.config.errors import ConfigError, UserError
from longformer_jax.evaluation.run_restore import check_saved_run
from longformer_jax.storage import paths, storage_errors
from longformer_jax.storage.storage_errors import StorageError, reporting
from longformer_jax.train import loop
from longformer_jax.train.run_directory import check_workdir
from tests.gcs_server import create_bucket, gcs_bucket, gcs_server_url, start_server  # pylint: disable=unused-import

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def connection_refused() -> Exception:
  """An outage as the clients raise it: aiohttp's connection error, wrapped by a caller."""
  key = aiohttp.client_reqrep.ConnectionKey('127.0.0.1', 4443, False, True, None, None, None)
  refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, 'Connect call failed'))
  try:
    try:
      raise refused
    except aiohttp.ClientError as error:
      raise RuntimeError('Orbax: the asynchronous save failed\n(3 more lines)') from error
  except RuntimeError as outer:
    return outer


def test_a_storage_failure_is_one_line_naming_operation_path_and_cause():
  with pytest.raises(StorageError) as caught:
    with reporting('saving checkpoint 4 in', 'gs://bucket/run/checkpoints'):
      raise connection_refused()
  message = str(caught.value)
  assert '\n' not in message and caught.value.exit_status == 75
  assert message.startswith('saving checkpoint 4 in gs://bucket/run/checkpoints failed: '
                            'ClientConnectorError: Cannot connect to host 127.0.0.1:4443')
  # Not the storage's: a bug, or the package's own error, passes unchanged.
  with pytest.raises(KeyError):
    with reporting('saving', 'x'):
      raise KeyError('params')
  with pytest.raises(ConfigError):
    with reporting('saving', 'x'):
      raise ConfigError('--workdir', 'bad')
  full = OSError(28, 'No space left on device')
  assert storage_errors.cause(full) == 'no space left on device (No space left on device)'


def test_cleanup_failures_never_replace_the_error_that_stopped_the_run(caplog):
  caplog.set_level(logging.WARNING)
  ran = []

  def fails(name):
    def action():
      ran.append(name)
      raise connection_refused()
    return action

  actions = [('finishing the checkpoint being saved in gs://b/run/checkpoints', fails('wait')),
             ('skipped', None),
             ('uploading metrics.jsonl and TensorBoard events to gs://b/run', fails('upload'))]
  stopping = StorageError('writing metrics in gs://b/run failed: the first error')
  loop.clean_up(actions, stopping)                     # logged, not raised
  assert ran == ['wait', 'upload']
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 2 and all('\n' not in line for line in lines), lines
  assert lines[1] == ('While stopping on the error below, uploading metrics.jsonl and '
                      'TensorBoard events to gs://b/run failed too: ClientConnectorError: '
                      'Cannot connect to host 127.0.0.1:4443 ssl:default '
                      '[Connect call failed]')
  # Nothing stopping the run: the first failure is the error, once every action ran.
  ran.clear()
  with pytest.raises(StorageError, match=r'^finishing the checkpoint being saved in '
                     r'gs://b/run/checkpoints failed: ClientConnectorError'):
    loop.clean_up(actions, None)
  assert ran == ['wait', 'upload']


def test_train_and_eval_word_a_missing_bucket_and_workdir_alike(gcs_bucket, tmp_path):
  messages = []
  for check in (check_workdir, check_saved_run):
    with pytest.raises(ConfigError) as refusal:
      check('gs://no-such-bucket-w/run')
    messages.append(str(refusal.value))
  assert messages[0] == messages[1] == (
      '--workdir: gs://no-such-bucket-w/run: bucket gs://no-such-bucket-w does not exist '
      '(create it with `gcloud storage buckets create gs://no-such-bucket-w`)')
  for workdir in (str(tmp_path / 'missing'), f'{gcs_bucket}/missing'):
    with pytest.raises(UserError, match=r"is not a directory \(a train.py workdir\)"):
      check_saved_run(workdir)
  (tmp_path / 'empty').mkdir()
  with pytest.raises(UserError, match=r'empty/config.json not found: is .* a train.py workdir'):
    check_saved_run(str(tmp_path / 'empty'))


SMALL_RUN = ['--config=configs/default.py', '--config.model.num_layers=1',
             '--config.model.d_model=32', '--config.model.d_ff=64', '--config.model.num_heads=2',
             '--config.model.head_dim=16', '--config.data.chunk_len=64',
             '--config.data.batch_size=8', '--config.train.eval_every=0',
             '--config.train.log_every=1', '--config.train.checkpoint_every=20',
             '--config.train.num_steps=100000']


@pytest.mark.slow
def test_an_outage_between_saves_ends_with_its_own_error_in_a_few_lines():
  """The GCS server dies after the first checkpoint: train.py exits with status 75 and a few
  lines whose error names the failed operation, not a cleanup's."""
  with tempfile.TemporaryFile() as server_log:
    server, url = start_server(server_log)
    try:
      create_bucket(url, 'outage')
      env = dict(os.environ, STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                 GOOGLE_AUTH_TOKEN_FOR_TESTING='local-test-token')
      run = subprocess.Popen([sys.executable, 'train.py', '--workdir=gs://outage/run',
                              *SMALL_RUN], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
      saved = os.environ.get('STORAGE_EMULATOR_HOST')
      os.environ['STORAGE_EMULATOR_HOST'] = url
      try:
        deadline = time.monotonic() + 300
        while not any(name.endswith('commit_success.txt')
                      for name in paths.list_files('gs://outage/run/checkpoints')):
          assert time.monotonic() < deadline and run.poll() is None, run.communicate()[1][-3000:]
          time.sleep(0.3)
      finally:
        if saved is None:
          os.environ.pop('STORAGE_EMULATOR_HOST')
        else:
          os.environ['STORAGE_EMULATOR_HOST'] = saved
    finally:
      server.kill()
      server.wait()
    killed = time.monotonic()
    _, stderr = run.communicate(timeout=900)
    seconds = time.monotonic() - killed
  print(f'exit status {run.returncode} {seconds:.0f} s after the outage; stderr:\n{stderr}')
  errors = [line for line in stderr.splitlines() if line.startswith('error: ')]
  assert run.returncode == 75, stderr[-3000:]
  assert 'Traceback' not in stderr, stderr[-3000:]
  assert len(stderr.strip().splitlines()) <= 5, stderr
  assert len(errors) == 1 and ' failed: ' in errors[0] and 'gs://outage/run' in errors[0], errors
  assert not errors[0].startswith('error: uploading metrics.jsonl and TensorBoard'), errors

"""A storage that fails mid-run: one clear message naming the operation, the path and the
cause (longformer_jax/storage/storage_errors.py), cleanup failures that never replace it
(train/loop.py `clean_up`), and the same words from train.py and eval.py for a missing
bucket. The outages themselves (a real GCS server paused or killed under a running train.py,
a full disk): tests/storage/test_storage_outages.py."""

import logging

import aiohttp
import pytest

from longformer_jax.config.errors import ConfigError, UserError
from longformer_jax.evaluation.run_restore import check_saved_run
from longformer_jax.storage import storage_errors
from longformer_jax.storage.storage_errors import StorageError, reporting
from longformer_jax.train import loop
from longformer_jax.train.run_directory import check_workdir
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import

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
  assert storage_errors.cause(full) == 'no space left on device (os error 28)'
  # TensorStore's words (inside Orbax's errors) for a full tmpfs and for `ulimit -f`.
  full = ValueError('RESOURCE_EXHAUSTED: Error opening "zarr" driver: Error writing "step/'
                    '.zarray" in OCDBT database at local file "/d/ocdbt.process_0/": Failed to '
                    'write 171 bytes to file 8: No space left on device [tensorstore_spec=\'{'
                    '"file_io_concurrency":{"limit":128}}\'] [os_error_code=\'28\']')
  assert storage_errors.cause(full) == 'no space left on device (os error 28)'
  limited = ValueError('OUT_OF_RANGE: Error writing "a/0" in OCDBT database at local file "/d/":'
                       ' Failed to write 338155 bytes to file 7: File too large '
                       '[os_error_code=\'27\']')
  assert storage_errors.cause(limited) == ('file too large (a file-size limit, e.g. ulimit -f) '
                                           '(os error 27)')


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

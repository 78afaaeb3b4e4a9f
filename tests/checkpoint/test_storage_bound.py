"""Every storage operation of a run within `checkpoint.storage_timeout_s`
(longformer_jax/checkpoint/storage_bound.py, run_checkpoints.py), the failures that are
worth retrying (storage/storage_errors.py), the exit that waits for no abandoned thread
(command_line.py) and the refusal of a held workdir before JAX loads (early_refusal.py).
The outages of whole train.py runs: tests/storage/test_storage_outages.py (slow)."""

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import aiohttp
from gcsfs import retry as gcsfs_retry
import ml_collections
import pytest

from longformer_jax.checkpoint import resume_checks
from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.checkpoint.early_refusal import held_workdir_refusal
from longformer_jax.checkpoint.run_checkpoints import RunCheckpoints
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.checkpoint.workdir_lease import Holder, process_start_ticks
from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import conditional_writes
from longformer_jax.storage.storage_errors import StorageError, StorageTimeoutError, is_transient
from longformer_jax.train import quiet_logs
from tests.support.gcs_server import create_bucket, start_server
from tests.support.repo_paths import REPO_ROOT


def refused() -> ConnectionRefusedError:
  return ConnectionRefusedError(errno.ECONNREFUSED, 'Connection refused')


def failing(errors: list, result='done'):
  """An operation that raises `errors` one per call, then returns `result`; `calls` counts."""
  def operation():
    operation.calls += 1
    if errors:
      raise errors.pop(0)
    return result
  operation.calls = 0
  return operation


def test_the_setting_is_checked_in_its_section():
  assert CheckpointConfig().storage_timeout_s == 120.0
  for bad in (0, -1, float('inf')):
    with pytest.raises(ConfigError, match=r'checkpoint.storage_timeout_s: .* must be a finite '
                       r'number of seconds > 0'):
      CheckpointConfig.build({'storage_timeout_s': bad}, 'checkpoint')


def test_a_config_sets_the_bound_and_an_old_one_gets_the_default():
  given = ml_collections.ConfigDict({'checkpoint': {'storage_timeout_s': 7.0}})
  assert StorageBound.of(given).seconds == 7.0
  assert StorageBound.of({'checkpoint': {'storage_timeout_s': 3}}).seconds == 3.0
  assert StorageBound.of(ml_collections.ConfigDict({'train': {}})).seconds == 120.0
  with pytest.raises(ConfigError, match='checkpoint.storage_timeout_s'):
    StorageBound.of({'checkpoint': {'storage_timeout_s': 0}})


def test_an_operation_returns_in_time_and_its_errors_pass_as_they_are():
  bound = StorageBound(5)
  assert bound.call('reading', 'gs://b/x', lambda: 42) == 42
  with pytest.raises(StorageError, match=r'^reading gs://b/x failed: FileNotFoundError'):
    bound.call('reading', 'gs://b/x', failing([FileNotFoundError(2, 'gone')]))
  with pytest.raises(KeyError):                      # not the storage's: a bug, unchanged
    bound.call('reading', 'gs://b/x', failing([KeyError('params')]))


def test_past_the_bound_the_operation_is_abandoned_and_named():
  release = threading.Event()
  started = time.monotonic()
  with pytest.raises(StorageTimeoutError) as caught:
    StorageBound(0.3).call('saving checkpoint 40 in', 'gs://b/run/checkpoints',
                           lambda: release.wait(60))
  seconds = time.monotonic() - started
  release.set()                                      # the abandoned thread may end now
  assert 0.3 <= seconds < 2, seconds
  assert str(caught.value) == ('saving checkpoint 40 in gs://b/run/checkpoints did not finish '
                               'within checkpoint.storage_timeout_s = 0.3 s')
  assert caught.value.exit_status == 75


def test_transient_failures_are_retried_within_the_bound_and_others_are_not():
  operation = failing([refused(), refused()])
  assert StorageBound(10).call('uploading', 'gs://b/m', operation, retry=True) == 'done'
  assert operation.calls == 3                        # after 0.5 and 1 s
  operation = failing([refused(), refused()])
  with pytest.raises(StorageError, match='uploading gs://b/m failed: ConnectionRefusedError'):
    StorageBound(10).call('uploading', 'gs://b/m', operation)          # retry=False
  assert operation.calls == 1
  operation = failing([OSError(errno.ENOSPC, 'No space left on device')])
  with pytest.raises(StorageError, match=r'failed: no space left on device \(os error 28\)$'):
    StorageBound(10).call('writing', '/d/run', operation, retry=True)
  assert operation.calls == 1                        # a full disk stays full


def test_retries_that_never_succeed_end_within_the_bound_with_the_last_error():
  operation = failing([refused()] * 100)
  started = time.monotonic()
  with pytest.raises(StorageError, match=r'^listing gs://b failed: ConnectionRefusedError'):
    StorageBound(2).call('listing', 'gs://b', operation, retry=True)
  assert time.monotonic() - started < 2.5 and operation.calls == 3   # at 0, 0.5 and 1.5 s
  release = threading.Event()
  errors = [refused()]

  def fails_then_hangs():
    if errors:
      raise errors.pop()
    release.wait(60)

  with pytest.raises(StorageTimeoutError, match=r'did not finish within checkpoint.storage_'
                     r'timeout_s = 1 s; the last error, retried: ConnectionRefusedError'):
    StorageBound(1).call('listing', 'gs://b', fails_then_hangs, retry=True)
  release.set()


def test_a_pending_operation_is_checked_without_blocking():
  release = threading.Event()
  pending = StorageBound(0.5).start('saving checkpoint 2 in', 'd', lambda: release.wait(60))
  started = time.monotonic()
  assert pending.check() is False and time.monotonic() - started < 0.1
  time.sleep(0.6)
  with pytest.raises(StorageTimeoutError, match='saving checkpoint 2 in d did not finish'):
    pending.check()
  release.set()
  assert StorageBound(5).start('x', 'd', lambda: None).wait() is None


@pytest.mark.parametrize('error, transient', [
    (refused(), True),
    (aiohttp.ClientConnectionError('Connection reset by peer'), True),
    (gcsfs_retry.HttpError({'code': 503, 'message': 'Service Unavailable'}), True),
    (gcsfs_retry.HttpError({'code': 429, 'message': 'Too Many Requests'}), True),
    (gcsfs_retry.HttpError({'code': 403, 'message': 'Forbidden'}), False),
    (ValueError('UNAVAILABLE: CURL error Couldn\'t connect to server'), True),
    (ValueError('NOT_FOUND: Error reading "a/0": no such key'), False),
    (OSError(errno.ENOSPC, 'No space left on device'), False),
    (FileNotFoundError(2, 'No such file'), False),
])
def test_which_failures_may_pass(error, transient):
  assert is_transient(error) == transient


def test_a_checkpoint_the_storage_cannot_read_now_is_not_taken_for_a_corrupt_one():
  outage = ValueError('UNAVAILABLE: CURL error Couldn\'t connect to server')
  error = resume_checks.read_error(40, 'gs://b/run/checkpoints', 'gs://b/run/checkpoints/40',
                                   outage)
  assert isinstance(error, StorageError) and not isinstance(error, resume_checks.CorruptCheckpointError)
  assert str(error) == ('reading checkpoint 40 in gs://b/run/checkpoints/40 failed: ValueError: '
                        'UNAVAILABLE: CURL error Couldn\'t connect to server')
  damaged = ValueError('DATA_LOSS: Error reading "a/0": checksum mismatch')
  assert isinstance(resume_checks.read_error(40, 'd', 'd/40', damaged),
                    resume_checks.CorruptCheckpointError)


def test_the_clients_copies_of_a_storage_failure_are_dropped_unless_debugging():
  def record(pathname: str, error: Exception) -> logging.LogRecord:
    try:
      raise error
    except Exception:  # pylint: disable=broad-except
      return logging.LogRecord('absl', logging.ERROR, pathname, 1, 'failed', (), sys.exc_info())

  drop = quiet_logs._NoClientStorageTracebacks()  # pylint: disable=protected-access
  orbax_file = '/site-packages/orbax/checkpoint/_src/futures/future.py'
  assert not drop.filter(record(orbax_file, OSError(errno.ENOSPC, 'full')))
  assert not drop.filter(record('/site-packages/gcsfs/retry.py', refused()))
  assert drop.filter(record(orbax_file, KeyError('a bug')))                 # shown
  assert drop.filter(record('/repo/longformer_jax/x.py', OSError(errno.ENOSPC, 'full')))


def test_gcsfs_is_configured_whichever_storage_module_loads_first():
  """paths.py turns gcsfs's experimental bucket-type lookups off before gcsfs loads (they
  log two warnings per outage); the early refusal loads storage_errors first."""
  for module in ('longformer_jax.checkpoint.early_refusal', 'longformer_jax.storage.storage_errors'):
    done = subprocess.run([sys.executable, '-c', f'import {module}, fsspec; '
                           'print(fsspec.get_filesystem_class("gs").__name__)'],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items()
                               if k != 'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'})
    assert done.stdout.strip() == 'GCSFileSystem', (module, done.stdout, done.stderr[-2000:])


def test_a_storage_failure_exits_at_once_whatever_threads_still_wait():
  """The line, status 75, and no wait for a thread that is not a daemon (Orbax's save
  threads are not); command_line.report_and_exit ends so on a `StorageError`."""
  script = ('import sys, threading, time\n'
            'from longformer_jax.storage import storage_errors\n'
            'threading.Thread(target=time.sleep, args=(600,)).start()\n'
            'print("error: saving checkpoint 4 in d failed: x", file=sys.stderr)\n'
            'storage_errors.exit_abandoning_threads(75)\n')
  started = time.monotonic()
  done = subprocess.run([sys.executable, '-c', script], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 75, done.stderr[-2000:]
  assert done.stderr.splitlines() == ['error: saving checkpoint 4 in d failed: x']
  assert time.monotonic() - started < 60


def write_live_lease(workdir: str, pid: int) -> Holder:
  """A lease of the live process `pid` of this host, renewed now."""
  now = time.time()
  holder = Holder(socket.gethostname(), pid, process_start_ticks(pid), now, now, 'a' * 16)
  conditional_writes.create(f'{workdir}/lease.json', holder.encode())
  return holder


@pytest.fixture
def live_process():
  sleeper = subprocess.Popen(['sleep', '300'])
  yield sleeper.pid
  sleeper.kill()
  sleeper.wait()


def test_a_held_workdir_is_refused_before_jax_loads(tmp_path, live_process):
  workdir = str(tmp_path / 'run')
  argv = ['train.py', f'--workdir={workdir}', '--config.train.num_steps=5']
  assert held_workdir_refusal(argv) is None                       # no lease
  write_live_lease(workdir, live_process)
  refusal = held_workdir_refusal(argv)
  assert refusal is not None and refusal.exit_status == 73
  assert str(refusal).startswith(f'--workdir: {workdir} is in use by another run (host ')
  assert held_workdir_refusal(['train.py', '--workdir', workdir]) is not None
  # The section's own settings decide what is live: a stale time shorter than the lease's
  # age makes it a dead run's, for the full start to take over.
  time.sleep(1.1)
  assert held_workdir_refusal(argv + ['--config.checkpoint.lease_stale_s=1',
                                      '--config.checkpoint.lease_renew_s=0.5']) is None
  # A multi-process run, or a config the full start must report, is left to the full start.
  assert held_workdir_refusal(argv + ['--config.parallel.multi_host=True']) is None
  assert held_workdir_refusal(argv + ['--config=configs/no_such_file.py']) is None
  # The command: one line, status 73, and JAX never imported (`-X importtime` lists imports).
  done = subprocess.run([sys.executable, '-X', 'importtime', 'train.py', f'--workdir={workdir}'],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, LONGFORMER_JAX_MALLOC='0'))
  assert done.returncode == 73, done.stderr[-2000:]
  lines = done.stderr.splitlines()
  assert lines[-1].startswith(f'error: --workdir: {workdir} is in use by another run')
  imported = [line.rsplit('|', 1)[-1].strip() for line in lines[:-1]]
  assert 'longformer_jax.checkpoint.early_refusal' in imported
  assert not [name for name in imported if name == 'jax' or name.startswith(('jax.', 'orbax'))]


def test_a_save_whose_writes_hang_is_noticed_within_its_bound_while_training_goes_on(tmp_path):
  """A real asynchronous Orbax save to a GCS server that stops answering once the step's
  first object exists: `RunCheckpoints.check()`, called as the loop calls it at every step,
  raises within the bound of the save's start; the step is never committed."""
  script = r'''
import sys, time
import jax.numpy as jnp, numpy as np
from longformer_jax.checkpoint.run_checkpoints import RunCheckpoints
from longformer_jax.checkpoint.storage_bound import StorageBound
checkpoints = RunCheckpoints('gs://hang/run', 2, True, StorageBound(3))
started = time.monotonic()
try:
  checkpoints.save(1, {'a': jnp.asarray(np.random.default_rng(0).random(1000))}, {'pos': 1})
  print('saving', flush=True)     # the save returned: its writes go on in the background
  while True:
    checkpoints.check()           # what the loop does between two training steps
    time.sleep(0.01)
except Exception as error:
  print(f'{time.monotonic() - started:.1f} {type(error).__name__}: {error}', flush=True)
from longformer_jax.storage.storage_errors import exit_abandoning_threads
exit_abandoning_threads(0)
'''
  with tempfile.TemporaryFile() as server_log:
    server, url = start_server(server_log)
    try:
      create_bucket(url, 'hang')
      env = dict(os.environ, STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                 GOOGLE_AUTH_TOKEN_FOR_TESTING='local-test-token')
      run = subprocess.Popen([sys.executable, '-c', script], cwd=REPO_ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      listing = f'{url}/storage/v1/b/hang/o?prefix=run/checkpoints/1/'
      deadline = time.monotonic() + 120
      while b'"items"' not in urllib.request.urlopen(listing, timeout=10).read():
        assert time.monotonic() < deadline and run.poll() is None, run.communicate()
        time.sleep(0.01)
      server.send_signal(signal.SIGSTOP)
      out, err = run.communicate(timeout=120)
      server.send_signal(signal.SIGCONT)
      assert b'commit_success' not in urllib.request.urlopen(listing, timeout=10).read()
    finally:
      server.send_signal(signal.SIGCONT)
      server.kill()
      server.wait()
  assert run.returncode == 0, err[-3000:]
  assert out.splitlines()[0] == 'saving', out
  seconds, message = out.splitlines()[-1].split(' ', 1)
  assert message == ('StorageTimeoutError: saving checkpoint 1 in gs://hang/run/checkpoints '
                     'did not finish within checkpoint.storage_timeout_s = 3 s'), out
  assert 3 <= float(seconds) < 6, out


def run_against_a_paused_server(arguments: list) -> tuple:
  """`(completed process, seconds)` of `python ARGUMENTS` against a GCS server whose bucket
  `paused` exists and which then stops answering (SIGSTOP: connections accepted, never
  answered)."""
  with tempfile.TemporaryFile() as server_log:
    server, url = start_server(server_log)
    try:
      create_bucket(url, 'paused')
      server.send_signal(signal.SIGSTOP)
      env = dict(os.environ, STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                 GOOGLE_AUTH_TOKEN_FOR_TESTING='local-test-token', LONGFORMER_JAX_MALLOC='0')
      started = time.monotonic()
      done = subprocess.run([sys.executable] + arguments, cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
      return done, time.monotonic() - started
    finally:
      server.send_signal(signal.SIGCONT)
      server.kill()
      server.wait()


def test_a_storage_that_does_not_answer_at_the_start_ends_the_run_within_the_bound():
  """The early look at the lease is the run's first storage operation: against a paused GCS
  server it ends the run in one line with status 75 after the bound, before JAX loads."""
  done, seconds = run_against_a_paused_server(
      ['-X', 'importtime', 'train.py', '--workdir=gs://paused/run',
       '--config.checkpoint.storage_timeout_s=2'])
  lines = done.stderr.splitlines()
  print(f'status {done.returncode} after {seconds:.1f} s: {lines[-1]}')
  assert done.returncode == 75, done.stderr[-2000:]
  assert lines[-1] == ('error: reading the lease gs://paused/run/lease.json did not finish '
                       'within checkpoint.storage_timeout_s = 2 s')
  assert not [line for line in lines[:-1] if not line.startswith('import time:')], lines[-5:]
  assert not [line for line in lines if line.rsplit('|', 1)[-1].strip() == 'jax']
  assert seconds < 2 + 30, seconds


def test_the_run_deletes_what_a_dead_save_left_and_readers_do_not(tmp_path):
  """A save cut off (a full disk, an abandoned save) leaves `<step>.orbax-checkpoint-tmp`;
  the training run, which holds the lease, deletes it when it opens its checkpoints (a full
  disk gets the space back); a reader (eval.py's Checkpointer) leaves it alone, since it may
  be a live run's save in flight."""
  workdir = str(tmp_path / 'run')
  unfinished = tmp_path / 'run' / 'checkpoints' / '40.orbax-checkpoint-tmp' / 'state'
  unfinished.mkdir(parents=True)
  (unfinished / 'part').write_bytes(b'\0' * 1000)
  Checkpointer(workdir, 2, async_save=False).close()
  assert unfinished.exists()
  RunCheckpoints(workdir, 2, True, StorageBound(60)).close()
  # Orbax deletes it in a background thread started when the checkpoints open (and awaits
  # that thread before the run's first save): milliseconds.
  deadline = time.monotonic() + 10
  while unfinished.parent.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not unfinished.parent.exists()


def test_eval_whose_storage_does_not_answer_ends_within_the_bound():
  """eval.py reads the run (config.json, then the checkpoint) within the command line's
  checkpoint.storage_timeout_s: against a paused GCS server, one line and status 75."""
  done, seconds = run_against_a_paused_server(
      ['eval.py', '--workdir=gs://paused/run', '--config.checkpoint.storage_timeout_s=2'])
  lines = done.stderr.splitlines()
  assert done.returncode == 75, done.stderr[-2000:]
  assert lines[-1] == ('error: reading the run in gs://paused/run did not finish within '
                       'checkpoint.storage_timeout_s = 2 s'), lines[-5:]
  assert seconds < 2 + 30, seconds

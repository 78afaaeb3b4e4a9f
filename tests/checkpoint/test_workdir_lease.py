"""One writer per workdir (longformer_jax/checkpoint/workdir_lease.py), locally and on gs://
(tests/support/gcs_server.py: a real GCS server on loopback).

The lease's own rules (live, dead by process, dead by time, renewal, loss, release) are
checked on lease files written as another run would write them; the command line's
refusal runs two real train.py processes on one workdir.
"""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import train as train_script
from longformer_jax.checkpoint import workdir_lease
from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.checkpoint.workdir_lease import (Holder, LeaseLostError, WorkdirInUseError,
                                                     WorkdirLease)
from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import conditional_writes, paths
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.repo_paths import REPO_ROOT
from tests.support.tiny_models import tiny_config

SETTINGS = CheckpointConfig(lease_renew_s=60.0, lease_stale_s=600.0)


@pytest.fixture(params=['local', 'gs'])
def workdir(request, tmp_path):
  if request.param == 'local':
    return str(tmp_path / 'run')
  return f'{request.getfixturevalue("gcs_bucket")}/lease/{os.path.basename(tmp_path)}'


def lease_path(workdir: str) -> str:
  return f'{workdir}/{workdir_lease.LEASE_FILE}'


def write_holder(workdir: str, host: str, pid: int, renewed_ago: float,
                 pid_start=None) -> Holder:
  """A lease as another run wrote it."""
  now = time.time()
  holder = Holder(host, pid, pid_start, now - renewed_ago - 5, now - renewed_ago, 'f' * 16)
  conditional_writes.create(lease_path(workdir), holder.encode())
  return holder


def read_holder(workdir: str) -> 'Holder | None':
  found = conditional_writes.read(lease_path(workdir))
  return Holder.decode(found[0]) if found else None


def finished_pid() -> int:
  """The id of a process of this host that has ended."""
  child = subprocess.Popen(['true'])
  child.wait()
  return child.pid


def test_config_section_checks_its_keys():
  with pytest.raises(ConfigError, match=r'config.checkpoint.lease_stale_s: 60.0 must be at least '
                     r'twice checkpoint.lease_renew_s = 60'):
    CheckpointConfig.build({'lease_stale_s': 60}, 'checkpoint')
  with pytest.raises(ConfigError, match='checkpoint.lease_renew_s: 0.0 must be > 0'):
    CheckpointConfig.build({'lease_renew_s': 0}, 'checkpoint')


def test_a_live_runs_lease_refuses_a_second_writer_in_one_line(workdir):
  other = write_holder(workdir, 'tpu-host-7', 4242, renewed_ago=30)
  before = conditional_writes.read(lease_path(workdir))
  with pytest.raises(WorkdirInUseError) as refusal:
    WorkdirLease.acquire(workdir, SETTINGS)
  message = str(refusal.value)
  assert '\n' not in message and refusal.value.exit_status == 73
  assert message.startswith(f'--workdir: {workdir} is in use by another run (host tpu-host-7, '
                            f'pid 4242, started ')
  assert 'renewed 30 s ago' in message and 'checkpoint.lease_stale_s' in message
  assert conditional_writes.read(lease_path(workdir)) == before      # untouched
  assert read_holder(workdir) == other


def test_a_live_process_on_this_host_holds_its_lease(tmp_path):
  workdir = str(tmp_path / 'run')
  sleeper = subprocess.Popen(['sleep', '60'])
  try:
    write_holder(workdir, socket.gethostname(), sleeper.pid, renewed_ago=0,
                 pid_start=workdir_lease.process_start_ticks(sleeper.pid))
    with pytest.raises(WorkdirInUseError, match=f'pid {sleeper.pid}'):
      WorkdirLease.acquire(workdir, SETTINGS)
  finally:
    sleeper.kill()
    sleeper.wait()
  # The same id, now another process (another start time): the holder is gone.
  conditional_writes.delete(lease_path(workdir), conditional_writes.read(lease_path(workdir))[1])
  write_holder(workdir, socket.gethostname(), os.getppid(), renewed_ago=0, pid_start=1)
  WorkdirLease.acquire(workdir, SETTINGS).release()


def test_a_dead_runs_lease_is_taken_over_with_one_line(workdir, caplog):
  caplog.set_level(logging.WARNING)
  pid = finished_pid()
  write_holder(workdir, socket.gethostname(), pid, renewed_ago=1)
  lease = WorkdirLease.acquire(workdir, SETTINGS)
  assert read_holder(workdir).pid == os.getpid()
  notices = [r.getMessage() for r in caplog.records if r.name == workdir_lease.__name__]
  assert len(notices) == 1 and '\n' not in notices[0], notices
  assert f'pid {pid}' in notices[0] and f'its process {pid} on this host is gone' in notices[0]
  lease.release()
  assert read_holder(workdir) is None
  caplog.clear()
  WorkdirLease.acquire(workdir, SETTINGS).release()     # a released lease: no notice
  assert not [r for r in caplog.records if r.name == workdir_lease.__name__]


def test_a_lease_not_renewed_in_time_is_taken_over_from_any_host(workdir, caplog):
  caplog.set_level(logging.WARNING)
  write_holder(workdir, 'tpu-host-7', 4242, renewed_ago=700)
  lease = WorkdirLease.acquire(workdir, SETTINGS)
  notice, = [r.getMessage() for r in caplog.records if r.name == workdir_lease.__name__]
  assert 'host tpu-host-7, pid 4242' in notice
  assert 'not renewed for 700 s > checkpoint.lease_stale_s = 600' in notice
  lease.release()


def test_renewal_and_a_lease_another_run_took_over(workdir):
  settings = CheckpointConfig(lease_renew_s=0.05, lease_stale_s=0.1)
  lease = WorkdirLease.acquire(workdir, settings)
  first = read_holder(workdir)
  lease.start_renewing()
  deadline = time.monotonic() + 30
  while read_holder(workdir).renewed == first.renewed and time.monotonic() < deadline:
    time.sleep(0.05)
  assert read_holder(workdir).renewed > first.renewed
  lease.check()
  # Another run judged this one dead and replaced the lease (between two renewals).
  taker = Holder('tpu-host-9', 99, None, time.time(), time.time(), 'e' * 16)
  while True:
    try:
      conditional_writes.replace(lease_path(workdir), taker.encode(),
                                 conditional_writes.read(lease_path(workdir))[1])
      break
    except conditional_writes.VersionChangedError:
      assert time.monotonic() < deadline
  while time.monotonic() < deadline:
    try:
      lease.check()
    except LeaseLostError as lost:
      assert 'taken over by host tpu-host-9, pid 99' in str(lost)
      break
    time.sleep(0.05)
  else:
    raise AssertionError('the loss of the lease was not noticed')
  lease.release()
  assert read_holder(workdir) == taker                   # the taker's lease stays


def lm_config(**checkpoint):
  config = tiny_config(attention='xl')
  config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
  config.checkpoint.update(checkpoint)
  return config


def test_a_run_takes_over_a_dead_lease_trains_and_releases_it(tmp_path, caplog):
  caplog.set_level(logging.WARNING)
  workdir = str(tmp_path / 'run')
  write_holder(workdir, 'tpu-host-7', 4242, renewed_ago=700)
  state, _ = train_script.train(lm_config(), workdir)
  assert int(state.step) == 2
  assert [r for r in caplog.records if 'Took over the lease' in r.getMessage()]
  assert read_holder(workdir) is None                     # released at the end


def test_a_run_whose_lease_is_taken_over_stops_without_saving_again(tmp_path):
  workdir = str(tmp_path / 'run')
  path = lease_path(workdir)
  taken = threading.Event()

  def take_over():     # another run, once this one holds the lease and has trained a step
    while not os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
      time.sleep(0.01)
    taker = Holder('tpu-host-9', 99, None, time.time(), time.time(), 'e' * 16)
    while not taken.is_set():   # the run renews every 20 ms: retry until between two
      try:
        conditional_writes.replace(path, taker.encode(), conditional_writes.read(path)[1])
        taken.set()
      except conditional_writes.VersionChangedError:
        pass

  thief = threading.Thread(target=take_over, daemon=True)
  thief.start()
  config = lm_config(lease_renew_s=0.02, lease_stale_s=0.04)
  config.train.update(num_steps=300, checkpoint_every=1)   # stops long before
  with pytest.raises(LeaseLostError, match='taken over by host tpu-host-9, pid 99'):
    train_script.train(config, workdir)
  assert taken.is_set()
  assert read_holder(workdir).host == 'tpu-host-9'        # the other run's lease stays


def start_train(workdir: str, *flags) -> subprocess.Popen:
  small = ['--config=configs/default.py', '--config.model.num_layers=1',
           '--config.model.d_model=32', '--config.model.d_ff=64', '--config.model.num_heads=2',
           '--config.model.head_dim=16', '--config.data.chunk_len=64',
           '--config.data.batch_size=8', '--config.train.eval_every=0',
           '--config.train.log_every=1', '--config.train.checkpoint_every=2']
  return subprocess.Popen([sys.executable, 'train.py', f'--workdir={workdir}', *small, *flags],
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def wait_for_lease(workdir: str, run: subprocess.Popen, timeout: float = 120) -> Holder:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and run.poll() is None:
    holder = read_holder(workdir)
    if holder is not None:
      return holder
    time.sleep(0.1)
  run.kill()
  raise AssertionError(f'no lease in {workdir}: {run.communicate()[1][-2000:]}')


def refuse_a_second_writer(workdir: str) -> None:
  """A second train.py on a workdir a live train.py holds: one line, status 73, the first
  run unaffected (it stops on SIGTERM as ever, releasing its lease)."""
  first = start_train(workdir, '--config.train.num_steps=100000')
  holder = wait_for_lease(workdir, first)
  assert holder.pid == first.pid and holder.host == socket.gethostname()
  started = time.monotonic()
  second = subprocess.run([sys.executable, 'train.py', f'--workdir={workdir}'], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
  seconds = time.monotonic() - started
  print(f'second writer refused in {seconds:.1f} s')
  assert first.poll() is None, first.communicate()[1][-2000:]
  assert second.returncode == 73, second.stderr[-2000:]
  lines = second.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  assert lines[0].startswith(f'error: --workdir: {workdir} is in use by another run '
                             f'(host {socket.gethostname()}, pid {first.pid}, started ')
  assert read_holder(workdir).pid == first.pid
  metrics = paths.as_path(workdir) / 'metrics.jsonl'
  deadline = time.monotonic() + 300       # SIGTERM saves once the run trains (its handler)
  while not (metrics.exists() and metrics.read_text()):
    assert time.monotonic() < deadline and first.poll() is None, first.communicate()[1][-2000:]
    time.sleep(0.2)
  first.send_signal(signal.SIGTERM)
  _, stderr = first.communicate(timeout=300)
  assert first.returncode == train_script.PREEMPTED_EXIT_STATUS, stderr[-3000:]
  assert read_holder(workdir) is None                     # released at its exit
  steps = [json.loads(line)['step'] for line in
           (paths.as_path(workdir) / 'metrics.jsonl').read_text().splitlines()]
  assert steps == list(range(1, len(steps) + 1))          # one writer: each step once


def test_a_second_train_py_on_a_local_workdir_is_refused(tmp_path):
  refuse_a_second_writer(str(tmp_path / 'run'))


@pytest.mark.slow
def test_a_second_train_py_on_a_gs_workdir_is_refused(gcs_bucket):
  refuse_a_second_writer(f'{gcs_bucket}/two_writers')

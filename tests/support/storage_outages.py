"""train.py runs under a failing storage: a tiny model's run (`Run`, its stderr lines timed),
fake-gcs-server paused, killed and brought back under it (`outage_run`), a full tmpfs disk
in a user namespace (`full_disk_run`), and the record of a run's last checkpoint.

Used by tests/storage/test_storage_outages.py and benchmarks/storage_faults.py."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from tests.support.gcs_server import create_bucket, free_port, start_server
from tests.support.repo_paths import REPO_ROOT

TIMEOUT_S = 15                 # the runs' checkpoint.storage_timeout_s
FIRST_SAVE, CUT_SAVE, END = 20, 40, 60
VALIDATE = 30                  # a validation pass between two saves: the outage's window
SMALL_RUN = ['--config=configs/default.py', '--config.model.num_layers=1',
             '--config.model.d_model=32', '--config.model.d_ff=64', '--config.model.num_heads=2',
             '--config.model.head_dim=16', '--config.data.chunk_len=64',
             '--config.data.batch_size=8', f'--config.train.eval_every={VALIDATE}',
             '--config.train.log_every=1', f'--config.train.checkpoint_every={FIRST_SAVE}',
             f'--config.checkpoint.storage_timeout_s={TIMEOUT_S}']


class Run:
  """A train.py process whose stderr lines are kept with the time each arrived."""

  def __init__(self, workdir: str, *flags, env=None):
    self.process = subprocess.Popen(
        [sys.executable, 'train.py', f'--workdir={workdir}', *SMALL_RUN, *flags], cwd=REPO_ROOT,
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    self.lines = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.process.stderr:
      self.lines.append((time.monotonic(), line.rstrip('\n')))

  def finish(self, timeout: float) -> tuple:
    """`(exit status, seconds since monotonic 0 when it ended)`."""
    self.process.wait(timeout=timeout)
    ended = time.monotonic()
    self._reader.join(timeout=10)
    return self.process.returncode, ended

  def stderr(self, since: float = 0.0) -> list:
    return [line for at, line in self.lines if at >= since]


def checkpoint_record(read) -> dict:
  """The checksums of every array of checkpoint `END` and its data position; `read(name)`:
  the text of the file `name` of the workdir."""
  return {item: json.loads(read(f'checkpoints/{END}/{item}/metadata'))
          for item in ('checksums', 'data')}


def local_reader(workdir: str):
  def read(name: str) -> str:
    with open(os.path.join(workdir, name), encoding='utf-8') as file:
      return file.read()
  return read


def logged_steps(read) -> list:
  """The steps of the training lines of metrics.jsonl."""
  lines = [json.loads(line) for line in read('metrics.jsonl').splitlines()]
  return [line['step'] for line in lines if line['split'] == 'train']


class Storage:
  """fake-gcs-server with its buckets in a folder: paused, killed and started again."""

  def __init__(self, root: str, log_file):
    self._root, self._log, self._port = root, log_file, free_port()
    self.process, self.url = start_server(log_file, root=root, port=self._port)
    self.env = dict(os.environ, STORAGE_EMULATOR_HOST=self.url,
                    TENSORSTORE_GCS_HTTP_URL=self.url,
                    GOOGLE_AUTH_TOKEN_FOR_TESTING='local-test-token')

  def reader(self, bucket: str, folder: str):
    """`read(name)`: the text of object `folder/name` of `bucket` (straight from the server's
    JSON API, so that no client of the test process caches anything)."""
    def read(name: str) -> str:
      quoted = urllib.parse.quote(f'{folder}/{name}', safe='')
      with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media',
                                  timeout=10) as reply:
        return reply.read().decode()
    return read

  def names(self, bucket: str, prefix: str) -> list:
    with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o?prefix={prefix}',
                                timeout=10) as reply:
      return [item['name'] for item in json.loads(reply.read()).get('items', [])]

  def cut(self, how: str) -> None:
    if how == 'paused':
      self.process.send_signal(signal.SIGSTOP)
    else:
      self.process.kill()
      self.process.wait()

  def bring_back(self, how: str) -> None:
    if how == 'paused':
      self.process.send_signal(signal.SIGCONT)
    else:
      self.process, _ = start_server(self._log, root=self._root, port=self._port)

  def stop(self) -> None:
    self.process.send_signal(signal.SIGCONT)
    self.process.kill()
    self.process.wait()


def outage_run(how: str, when: str, root: str, *flags) -> dict:
  """train.py on `gs://outage/run` (steps 1-60, checkpoints every 20, validation at 30 and
  60) with the server's buckets in `root`; the server `how` ('paused', 'killed') `when`
  ('during a save': once checkpoint 40's first object exists; 'between saves': once
  checkpoint 20 is committed, before 40 begins), brought back once the run ended, and the
  same command run again.

  Returns `status`, `seconds` (from the outage to the exit), `lines` (stderr since the
  outage), `stderr` (the last 30 lines), `cut_committed` (whether checkpoint 40 got its
  commit marker), `rerun` (its status), `record` (`checkpoint_record` of the rerun, or
  None) and `steps` (the steps of its metrics.jsonl). `flags`: more train.py flags.
  """
  with tempfile.TemporaryFile() as server_log:
    storage = Storage(root, server_log)
    try:
      create_bucket(storage.url, 'outage')
      workdir, step_dir = 'gs://outage/run', 'run/checkpoints/'
      run = Run(workdir, f'--config.train.num_steps={END}', *flags, env=storage.env)
      deadline = time.monotonic() + 600
      commit = f'{step_dir}{FIRST_SAVE}/commit_success.txt'
      while commit not in storage.names('outage', f'{step_dir}{FIRST_SAVE}/'):
        assert time.monotonic() < deadline and run.process.poll() is None, run.stderr()[-30:]
        time.sleep(0.01)
      if when == 'during a save':
        while not storage.names('outage', f'{step_dir}{CUT_SAVE}/'):
          assert time.monotonic() < deadline and run.process.poll() is None, run.stderr()[-30:]
          time.sleep(0.01)
      else:
        assert not storage.names('outage', f'{step_dir}{CUT_SAVE}/'), 'checkpoint 40 began'
      storage.cut(how)
      cut_at = time.monotonic()
      status, ended = run.finish(timeout=900)
      result = {'status': status, 'seconds': ended - cut_at, 'lines': run.stderr(since=cut_at),
                'stderr': run.stderr()[-30:]}
      storage.bring_back(how)
      result['cut_committed'] = f'{step_dir}{CUT_SAVE}/commit_success.txt' in storage.names(
          'outage', f'{step_dir}{CUT_SAVE}/')
      rerun = Run(workdir, f'--config.train.num_steps={END}', *flags, env=storage.env)
      result['rerun'], _ = rerun.finish(timeout=600)
      read = storage.reader('outage', 'run')
      result['record'] = checkpoint_record(read) if result['rerun'] == 0 else None
      result['steps'] = logged_steps(read)
      return result
    finally:
      storage.stop()


FULL_DISK_DRIVER = r'''
import json, os, subprocess, sys
sys.path.insert(0, os.getcwd())
from tests.support.storage_outages import Run, checkpoint_record, local_reader
disk, size = sys.argv[1], sys.argv[2]
subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', disk], check=True)
workdir = os.path.join(disk, 'run')
results = {}
first = Run(workdir, '--config.train.num_steps=60', '--config.train.stop_after_steps=20')
results['first'] = first.finish(timeout=600)[0]
free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
with open(os.path.join(disk, 'filler'), 'wb') as filler:   # leave 64 KiB: no checkpoint fits
  filler.write(b'\0' * (free - 64 * 1024))
full = Run(workdir, '--config.train.num_steps=60')
results['full'] = full.finish(timeout=600)[0]
results['full_stderr'] = full.stderr()
results['steps_after_full'] = sorted(name for name in os.listdir(os.path.join(workdir, 'checkpoints')))
os.remove(os.path.join(disk, 'filler'))
rerun = Run(workdir, '--config.train.num_steps=60')
results['rerun'] = rerun.finish(timeout=600)[0]
results['rerun_stderr'] = rerun.stderr()[-30:]
results['record'] = checkpoint_record(local_reader(workdir)) if results['rerun'] == 0 else None
results['steps_after_rerun'] = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
print(json.dumps(results))
'''


def namespaces_allowed() -> bool:
  """Whether this user may mount a tmpfs in a user namespace of its own."""
  if shutil.which('unshare') is None:
    return False
  probe = subprocess.run(['unshare', '-rm', 'sh', '-c', 'mount -t tmpfs -o size=1m tmpfs /mnt'],
                         capture_output=True, check=False)
  return probe.returncode == 0


def full_disk_run(disk: str, size: str = '8m') -> dict:
  """In a user namespace, a tmpfs of `size` on the folder `disk`: train.py to checkpoint
  20, the disk filled but 64 KiB, the same command (status and stderr: `full`, the
  checkpoints it left: `steps_after_full`), the filler removed and the command again
  (`rerun`, its `record` and `steps_after_rerun`)."""
  driver = subprocess.run(['unshare', '-rm', sys.executable, '-c', FULL_DISK_DRIVER, disk, size],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
  assert driver.returncode == 0, driver.stderr[-3000:]
  return json.loads(driver.stdout.strip().splitlines()[-1])

"""The storage faults of docs/training.md ("Storage faults, measured"), each on real train.py
processes, as a table.

  python benchmarks/storage_faults.py [--timeout_s=120] [--faults=outage,writer,stale,disk]
      [--outages=paused-during,killed-between]

Every run is the tiny model of tests/support/storage_outages.py (configs/default.py with one
layer of d_model 32, 60 steps, a checkpoint every 20, validation at 30 and 60), and every
"after" column compares the run's last checkpoint (the checksums of all its arrays and its
data position) with an uninterrupted local run's:

- `outage`: a gs:// workdir on a local GCS server (tests/support/gcs_server.py, buckets in a
  folder) paused (SIGSTOP) or killed during the save of checkpoint 40 or between the
  saves, with `checkpoint.storage_timeout_s = --timeout_s`: seconds from the outage to the
  exit, stderr lines since the outage, the status; then the server back and the same
  command again (`outage_run`);
- `writer`: a second train.py started on a local workdir a live run holds: seconds to its
  refusal, its lines and status; the first run's end;
- `stale`: a lease left by a run on another host, not renewed for 700 s: the run's
  takeover notice and end;
- `disk`: a tmpfs of 8 MiB in a user namespace, filled after checkpoint 20 (`full_disk_run`).

The 2048^3 float32 matmul rate is measured before and after (the host's load).
"""

import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # pylint: disable=wrong-import-position

from benchmarks.matmul_rate import measure  # pylint: disable=wrong-import-position
from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig  # pylint: disable=wrong-import-position
from longformer_jax.checkpoint.workdir_lease import Holder  # pylint: disable=wrong-import-position
from longformer_jax.storage import conditional_writes  # pylint: disable=wrong-import-position
from tests.support.storage_outages import (END, SMALL_RUN, Run, checkpoint_record,  # pylint: disable=wrong-import-position
                                           full_disk_run, local_reader, namespaces_allowed,
                                           outage_run)

flags.DEFINE_float('timeout_s', CheckpointConfig().storage_timeout_s,
                   'checkpoint.storage_timeout_s of the outage runs.')
flags.DEFINE_list('faults', ['outage', 'writer', 'stale', 'disk'], 'The faults to measure.')
flags.DEFINE_list('outages', ['paused-during', 'paused-between', 'killed-during',
                              'killed-between'], 'HOW-WHEN of the outages.')
FLAGS = flags.FLAGS


def uninterrupted(folder: str) -> dict:
  workdir = os.path.join(folder, 'uninterrupted')
  run = Run(workdir, f'--config.train.num_steps={END}')
  status, _ = run.finish(timeout=900)
  assert status == 0, run.stderr()
  return checkpoint_record(local_reader(workdir))


def same(record, reference) -> str:
  return 'bit-identical' if record == reference else 'DIFFERENT'


def error_line(lines: list) -> str:
  errors = [line for line in lines if line.startswith('error: ')]
  return errors[-1] if errors else '(no error line)'


def outage_rows(folder: str, reference: dict) -> list:
  rows = []
  for case in FLAGS.outages:
    how, when = case.split('-')
    when = {'during': 'during a save', 'between': 'between saves'}[when]
    result = outage_run(how, when, os.path.join(folder, case),
                        f'--config.checkpoint.storage_timeout_s={FLAGS.timeout_s:g}')
    rows.append((f'storage {how} {when} (storage_timeout_s {FLAGS.timeout_s:g})',
                 f'exit {result["seconds"]:.1f} s after the outage, {len(result["lines"])} '
                 f'stderr lines since: `{error_line(result["lines"])}`', result['status'],
                 f'rerun status {result["rerun"]}, {same(result["record"], reference)}'))
  return rows


def writer_row(folder: str, reference: dict) -> tuple:
  workdir = os.path.join(folder, 'writer')
  first = Run(workdir, f'--config.train.num_steps={END}')
  deadline = time.monotonic() + 600
  while not os.path.exists(os.path.join(workdir, 'lease.json')):
    assert time.monotonic() < deadline and first.process.poll() is None, first.stderr()
    time.sleep(0.05)
  started = time.monotonic()
  second = subprocess.run([sys.executable, 'train.py', f'--workdir={workdir}', *SMALL_RUN],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
  seconds = time.monotonic() - started
  lines = second.stderr.strip().splitlines()
  status, _ = first.finish(timeout=900)
  return ('a second train.py on a live run\'s workdir',
          f'refused in {seconds:.1f} s, {len(lines)} line: `{error_line(lines)}`',
          second.returncode,
          f'first run status {status}, {same(checkpoint_record(local_reader(workdir)), reference)}')


def stale_row(folder: str, reference: dict) -> tuple:
  workdir = os.path.join(folder, 'stale')
  now = time.time()
  conditional_writes.create(os.path.join(workdir, 'lease.json'),
                            Holder('tpu-host-7', 4242, None, now - 800, now - 700,
                                   'f' * 16).encode())
  run = Run(workdir, f'--config.train.num_steps={END}')
  status, _ = run.finish(timeout=900)
  notices = [line for line in run.stderr() if 'Took over the lease' in line]
  return ('a lease not renewed for 700 s (another host)',
          f'{len(notices)} notice: `{notices[0].split("] ", 1)[-1] if notices else ""}`',
          status, same(checkpoint_record(local_reader(workdir)), reference))


def disk_row(folder: str, reference: dict) -> tuple:
  if not namespaces_allowed():
    return ('a full local disk', 'not measured: no user namespace here', '', '')
  disk = os.path.join(folder, 'disk')
  os.makedirs(disk)
  result = full_disk_run(disk)
  errors = [line for line in result['full_stderr'] if line.startswith('error: ')]
  return ('a full local disk (tmpfs of 8 MiB, 64 KiB left after checkpoint 20)',
          f'{len(errors)} error line: `{error_line(result["full_stderr"])}`', result['full'],
          f'checkpoints left {result["steps_after_full"]}; rerun status {result["rerun"]}, '
          f'{same(result["record"], reference)}')


def main(argv):
  del argv
  before = measure().median_flops_per_s / 1e9
  with tempfile.TemporaryDirectory(prefix='storage_faults_') as folder:
    reference = uninterrupted(folder)
    rows = []
    if 'outage' in FLAGS.faults:
      rows += outage_rows(folder, reference)
    for name, row in (('writer', writer_row), ('stale', stale_row), ('disk', disk_row)):
      if name in FLAGS.faults:
        rows.append(row(folder, reference))
  after = measure().median_flops_per_s / 1e9
  print(f'matmul 2048^3 float32: {before:.0f} GFLOP/s before, {after:.0f} after')
  print('| fault | measured | status | after |\n|---|---|---|---|')
  for row in rows:
    print('| ' + ' | '.join(str(cell) for cell in row) + ' |')


if __name__ == '__main__':
  app.run(main)

"""The storage failing under a running train.py (docs/training.md, "When the storage fails").

A real GCS server (tests/support/gcs_server.py, its buckets in a folder so that it can come back)
is paused (SIGSTOP: connections are accepted and never answered) or killed (connections
refused) while a checkpoint is being saved, or between two saves. The run must end within
`checkpoint.storage_timeout_s` + 30 s of the outage, with at most 5 lines on stderr from
then on, one of them the error, and exit status 75; once the server is back, the same
command resumes from the newest complete checkpoint and ends bit-identical to a run that
never failed (the checksums of every array of its last checkpoint, and its data position).

A full local disk: a tmpfs of a few MiB, mounted in a user namespace (`unshare -rm`, no
root needed where the kernel lets users create namespaces), filled up after a first
checkpoint so that the next one cannot be written.
"""

import pytest

from tests.support.storage_outages import (END, Run, TIMEOUT_S, checkpoint_record, full_disk_run,
                                           local_reader, namespaces_allowed, outage_run)

# With the server killed, past gcsfs's own retries (about 31 s), which log a traceback each.
KILLED_TIMEOUT_S = 45
GRACE_S = 30                   # the bound: exit within the timeout + 30 s


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory) -> dict:
  """The last checkpoint of a run that never failed (a local workdir: a gs:// run is
  bit-identical to it, tests/storage/test_gcs_workdir.py)."""
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  run = Run(workdir, f'--config.train.num_steps={END}')
  status, _ = run.finish(timeout=600)
  assert status == 0, '\n'.join(run.stderr()[-30:])
  return checkpoint_record(local_reader(workdir))


@pytest.mark.slow
@pytest.mark.parametrize('when', ['during a save', 'between saves'])
@pytest.mark.parametrize('how', ['paused', 'killed'])
def test_an_outage_ends_the_run_in_time_and_the_rerun_resumes_bit_identically(
    how, when, uninterrupted, tmp_path):
  bound = TIMEOUT_S if how == 'paused' else KILLED_TIMEOUT_S
  result = outage_run(how, when, str(tmp_path / 'buckets'),
                      f'--config.checkpoint.storage_timeout_s={bound}')
  lines = result['lines']
  print(f'{how} {when}: status {result["status"]} {result["seconds"]:.1f} s after the outage, '
        f'{len(lines)} lines on stderr since:\n' + '\n'.join(lines))
  assert result['status'] == 75, '\n'.join(result['stderr'])
  assert result['seconds'] <= bound + GRACE_S
  assert len(lines) <= 5 and not any('Traceback' in line for line in lines), lines
  errors = [line for line in lines if line.startswith('error: ')]
  assert len(errors) == 1 and 'gs://outage/run' in errors[0], lines
  assert not any('While stopping' in line for line in lines), lines     # no cleanup waited
  assert not result['cut_committed']               # the abandoned save was never committed
  assert result['rerun'] == 0
  assert result['record'] == uninterrupted
  assert result['steps'] == list(range(1, END + 1))                     # each step once


@pytest.mark.slow
def test_a_full_disk_ends_the_run_in_one_line_and_the_last_checkpoint_restores(
    uninterrupted, tmp_path):
  if not namespaces_allowed():
    pytest.skip('no user namespace for a small tmpfs here (unshare -rm refused)')
  disk = tmp_path / 'disk'
  disk.mkdir()
  results = full_disk_run(str(disk))
  print('full disk: status', results['full'], 'stderr:\n' + '\n'.join(results['full_stderr']))
  assert results['first'] == 0
  assert results['full'] == 75, results['full_stderr']
  errors = [line for line in results['full_stderr'] if line.startswith('error: ')]
  assert len(errors) == 1 and 'no space left on device (os error 28)' in errors[0], errors
  assert not any('Traceback' in line for line in results['full_stderr'])
  assert '20' in results['steps_after_full']
  assert results['rerun'] == 0, results['rerun_stderr']
  assert results['record'] == uninterrupted
  # The cut step's unfinished folder was deleted by the rerun, which holds the lease.
  assert all(name.isdigit() for name in results['steps_after_rerun']), results

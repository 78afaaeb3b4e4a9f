"""Several processes on loopback, as on a pod slice or a GPU cluster (parallel/distributed.py).

Each test launches tests/support/multi_process_worker.py as 1 or 2 processes over 8 CPU
devices in all (8 x 1 or 4 x 2), all joined through `jax.distributed` with Gloo.

- fast: two processes see one mesh of 8 devices and reduce an array each fed
  half of, giving what one process of 8 devices gives;
- slow: training 3 steps as 2 processes x 4 devices gives the parameters of
  1 process x 8 devices; a checkpoint written by 2 processes resumes in 1
  (and the reverse) and training then continues as an uninterrupted run.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.parallel.parallel_config import ParallelConfig
from longformer_jax.storage import paths
from tests.support.gcs_server import free_port, gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.repo_paths import REPO_ROOT

WORKER = os.path.join(REPO_ROOT, 'tests', 'support', 'multi_process_worker.py')
TOTAL_DEVICES = 8
# The worker's result line: `process 1 of 2, 8 devices, sum 140.0`.
RESULT_LINE = re.compile(r'process \d+ of \d+, \d+ devices, sum [-\d.e]+\n')


def launch(mode: str, num_processes: int, out: str = '-', *extra, timeout=600) -> list[str]:
  """Runs the worker as `num_processes` processes; returns each one's stdout."""
  port = str(free_port())
  local = str(TOTAL_DEVICES // num_processes)
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')}
  procs = [subprocess.Popen([sys.executable, WORKER, mode, str(num_processes), str(i), port,
                             local, out, *extra], cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for i in range(num_processes)]
  outputs = []
  try:
    for proc in procs:
      stdout, stderr = proc.communicate(timeout=timeout)
      assert proc.returncode == 0, stderr[-3000:]
      # Gloo's C++ side reports its connections on stdout from several threads, and its
      # pieces can land anywhere around the worker's lines: only whole result lines are kept.
      outputs.append(''.join(RESULT_LINE.findall(stdout)))
  finally:
    for proc in procs:    # a process left waiting for a peer that died must not outlive the test
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  return outputs


def test_two_processes_share_one_mesh():
  one = launch('sum', 1)
  two = launch('sum', 2)
  expected = float(sum(i * i for i in range(TOTAL_DEVICES)))
  assert one == [f'process 0 of 1, 8 devices, sum {expected}\n']
  assert two == [f'process {i} of 2, 8 devices, sum {expected}\n' for i in range(2)]


def test_launch_settings_are_checked():
  with pytest.raises(ConfigError, match='parallel.num_processes.*multi_host'):
    ParallelConfig.build({'num_processes': 2, 'process_id': 0}, 'parallel')
  with pytest.raises(ConfigError, match='parallel.process_id.*below parallel.num_processes'):
    ParallelConfig.build({'multi_host': True, 'num_processes': 2, 'process_id': 2}, 'parallel')
  with pytest.raises(ConfigError, match='parallel.process_id.*set together'):
    ParallelConfig.build({'multi_host': True, 'num_processes': 2}, 'parallel')
  ParallelConfig.build({'multi_host': True, 'coordinator_address': '10.0.0.1:1234',
                        'num_processes': 2, 'process_id': 1}, 'parallel')


def train_params(tmp_path, name: str, runs) -> dict:
  """Trains in one workdir as `runs`: a list of (processes, steps), each resuming the last."""
  workdir, out = str(tmp_path / name), str(tmp_path / f'{name}.npz')
  for processes, steps in runs:
    launch('train', processes, out, workdir, str(steps))
  return dict(np.load(out))


def assert_same_params(a: dict, b: dict) -> None:
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_two_processes_train_like_one_and_checkpoints_move_between_them(tmp_path):
  one = train_params(tmp_path, 'one', [(1, 3)])
  two = train_params(tmp_path, 'two', [(2, 3)])
  assert_same_params(one, two)
  straight = train_params(tmp_path, 'straight', [(1, 5)])
  assert_same_params(straight, train_params(tmp_path, 'two_then_one', [(2, 3), (1, 5)]))
  assert_same_params(straight, train_params(tmp_path, 'one_then_two', [(1, 3), (2, 5)]))
  # The two steps after the checkpoint moved the parameters far beyond the tolerance.
  assert max(np.abs(straight[name] - one[name]).max() for name in one) > 1e-2


@pytest.mark.slow
def test_two_processes_share_one_gs_workdir(tmp_path, gcs_bucket):
  """Two processes train in one gs:// workdir (the local GCS server): process 0 writes the
  run's files, both write their shards of the checkpoint, and one process resumes it."""
  workdir = f'{gcs_bucket}/two_processes'
  out = str(tmp_path / 'gcs.npz')
  launch('train', 2, out, workdir, '3')
  assert_same_params(train_params(tmp_path, 'one', [(1, 3)]), dict(np.load(out)))
  launch('train', 1, out, workdir, '5')
  assert_same_params(train_params(tmp_path, 'straight', [(1, 5)]), dict(np.load(out)))
  steps = [json.loads(line)['step'] for line in
           (paths.as_path(workdir) / 'metrics.jsonl').read_text().splitlines()]
  assert steps == [1, 2, 3, 4, 5]

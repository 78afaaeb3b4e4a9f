"""Profiles: `train.profile_steps` and `eval.profile_batches` write jax.profiler traces of
exactly the chosen steps under the workdir (train/profiling.py)."""

import gzip
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths
from longformer_jax.train.profiling import StepProfiler, trace_files
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.tiny_models import tiny_config


def traced_steps(directory: str, name: str) -> list[int]:
  """The step numbers of the `name` step annotations in the one Perfetto trace under
  `directory` (read from the file, not from the profiler's own bookkeeping)."""
  traces = [path for path in trace_files(directory) if path.endswith('.trace.json.gz')]
  assert len(traces) == 1, traces
  with gzip.open(traces[0]) as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  return sorted(int(event['args']['step_num']) for event in events
                if event.get('name') == name and 'step_num' in event.get('args', {}))


def run_toy_loop(profiler: StepProfiler, numbers) -> None:
  step = jax.jit(lambda x: jnp.tanh(x) @ x)
  x = jnp.eye(8)
  try:
    for number in numbers:
      profiler.before(number)
      with profiler.annotation(number):
        x = step(x)
      profiler.after(number, x)
  finally:
    profiler.close()


def run_config(**train_overrides):
  config = tiny_config(attention='xl')
  config.train.update(num_steps=8, log_every=2, eval_every=0, checkpoint_every=8)
  config.train.update(**train_overrides)
  config.eval.max_tokens = 2048
  return config


@pytest.fixture(scope='module')
def profiled_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('profiled'))
  _, metrics = train_script.train(run_config(profile_steps='4,6'), workdir)
  return workdir, metrics


def test_an_8_step_run_traces_steps_4_to_6(profiled_run):
  workdir, metrics = profiled_run
  directory = os.path.join(workdir, 'profile', 'train')
  names = [os.path.basename(path) for path in trace_files(directory)]
  assert any(name.endswith('.xplane.pb') for name in names), names       # XProf / TensorBoard
  assert traced_steps(directory, 'train') == [4, 5, 6]
  assert metrics['step'] == 8
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  rates = [line['tokens_per_s'] for line in lines if line['split'] == 'train']
  assert len(rates) == 4 and all(np.isfinite(rate) and rate > 0 for rate in rates)


def test_eval_traces_the_chosen_batches(profiled_run):
  workdir, _ = profiled_run
  config = run_config()
  config.eval.profile_batches = '1,1'     # the tiny split is one batch of the evaluator
  eval_script.evaluate_run(config, workdir)
  assert traced_steps(os.path.join(workdir, 'profile', 'eval'), 'eval') == [1]


def test_a_loop_that_ends_or_starts_inside_the_window_traces_what_it_ran(tmp_path):
  for numbers, window, expected in (((1, 2, 3, 4), (3, 9), [3, 4]),      # ends inside
                                    ((5, 6, 7, 8), (3, 6), [5, 6]),      # resumed inside
                                    ((1, 2), (3, 4), None)):             # never reaches it
    directory = str(tmp_path / f'{window}-{numbers[0]}')
    run_toy_loop(StepProfiler(directory, window, name='train'), numbers)
    if expected is None:
      assert not os.path.exists(directory)
    else:
      assert traced_steps(directory, 'train') == expected


def test_a_gs_workdir_gets_the_trace_uploaded(gcs_bucket, tmp_path):
  directory = f'{gcs_bucket}/profiled/profile/train'
  run_toy_loop(StepProfiler(directory, (2, 3), name='train'), (1, 2, 3, 4))
  uploaded = paths.list_files(directory)
  assert any(name.endswith('.xplane.pb') for name in uploaded), uploaded
  local = tmp_path / 'downloaded'
  for name in uploaded:
    target = local / name
    target.parent.mkdir(parents=True, exist_ok=True)
    paths.download_file(f'{directory}/{name}', target)
  assert traced_steps(str(local), 'train') == [2, 3]


@pytest.mark.parametrize('section, key, value', [
    ('train', 'profile_steps', '15,10'),
    ('train', 'profile_steps', 'ten,15'),
    ('train', 'profile_steps', '0,3'),
    ('train', 'profile_steps', '4,9'),          # past num_steps=8
    ('eval', 'profile_batches', '3'),
])
def test_a_bad_window_names_its_key(tmp_path, section, key, value):
  config = run_config()
  config[section][key] = value
  with pytest.raises(ConfigError) as error:
    train_script.train(config, str(tmp_path))
  assert error.value.key == f'{section}.{key}'
  assert not os.listdir(tmp_path)     # refused before anything was written

"""The Long Range Arena's configs run (configs/lra.py): every task and variant builds and checks at
both scales (default suite); 20 steps of each task with two variants through train.py and
eval.py, and a few steps of every full-scale config on the CPU (slow)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from configs import lra
from longformer_jax.experiment_config import resolve_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Small data for runs on the CPU: the generators' counts, not their shapes.
SMALL_COUNTS = {'train_examples': 64, 'valid_examples': 16, 'test_examples': 16}
SECTION = {'listops': 'listops', 'pathfinder': 'pathfinder', 'text': 'lra_text',
           'retrieval': 'lra_retrieval'}
ALL_RUNS = [(task, variant, scale) for scale in lra.SCALES for task in lra.TASKS
            for variant in lra.variants(task, scale)]


@pytest.mark.parametrize('task, variant, scale', ALL_RUNS)
def test_every_config_resolves(task, variant, scale):
  config = resolve_config(lra.get_config(f'{task},{variant},{scale}'))
  assert config['task'] == ('retrieval' if task == 'retrieval' else 'classification')
  assert config['model']['num_classes'] == (10 if task == 'listops' else 2)


def test_bad_arguments_name_the_flag():
  for arg in ('listops', 'sorting,vanilla', 'listops,image_local_2d', 'text,vanilla,huge'):
    with pytest.raises(Exception) as error:
      lra.get_config(arg)
    assert '--config' in str(error.value)


def small_overrides(task: str, steps: int) -> list[str]:
  """Command-line overrides that shrink a run's data and budget (not its model or lengths)."""
  section = SECTION[task]
  return ([f'--config.data.{section}.{k}={v}' for k, v in SMALL_COUNTS.items()]
          + [f'--config.train.num_steps={steps}', f'--config.train.eval_every={steps}',
             f'--config.train.checkpoint_every={steps}', '--config.data.batch_size=8',
             '--config.data.eval_batch_size=8', '--config.train.log_every=10'])


def run_script(arguments: list[str]) -> None:
  """Runs a script of the repository (the suite's fast-compiling XLA flags: 20 steps are
  mostly compilation)."""
  done = subprocess.run([sys.executable] + arguments, cwd=ROOT, capture_output=True, text=True,
                        timeout=1800)
  assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize('task, variant', [
    ('listops', 'vanilla'), ('listops', 'bigbird'),
    ('pathfinder', 'longformer'), ('pathfinder', 'image_local_2d'),
    ('text', 'performer'), ('text', 'sparse_fixed'),
    ('retrieval', 'reformer'), ('retrieval', 'routing'),
])
def test_twenty_steps_train_and_test(task, variant, tmp_path):
  config = f'--config=configs/lra.py:{task},{variant},mini'
  overrides = small_overrides(task, 20)
  if task == 'retrieval':   # its mini config's 900-step length curriculum: switch halfway
    overrides.append('--config.data.lra_retrieval.curriculum_steps=10')
  run_script(['train.py', config, f'--workdir={tmp_path}'] + overrides)
  run_script(['eval.py', config, f'--workdir={tmp_path}', '--config.eval.split=test']
             + overrides)
  metrics = json.loads((tmp_path / 'eval' / 'metrics.json').read_text())
  assert metrics['checkpoint_step'] == 20 and metrics['split'] == 'test'
  assert metrics['examples'] == SMALL_COUNTS['test_examples']
  assert 0.0 <= metrics['accuracy'] <= 1.0 and np.isfinite(metrics['loss'])


FULL_RUNS = [(task, variant) for task in lra.TASKS for variant in lra.variants(task, 'full')]
# One device: the suite's 8 fake devices would ask for a batch of 8, and LRA's full models at
# 2,048-4,096 tokens run out of a 24 GiB host at that batch (ListOps vanilla did).
ONE_DEVICE = '--xla_force_host_platform_device_count=1'


def one_device_environment() -> dict:
  """The suite's environment with its fast-compiling flags on a single CPU device."""
  flags = [flag for flag in os.environ.get('XLA_FLAGS', '').split()
           if not flag.startswith('--xla_force_host_platform_device_count')]
  return dict(os.environ, XLA_FLAGS=' '.join(flags + [ONE_DEVICE]))


@pytest.mark.slow
@pytest.mark.parametrize('task, variant', FULL_RUNS)
def test_full_scale_config_takes_steps_on_the_cpu(task, variant, tmp_path):
  """Two training steps of LRA's full shapes and lengths through train.py, batch 1."""
  overrides = small_overrides(task, 2) + ['--config.data.batch_size=1',
                                          '--config.data.eval_batch_size=1',
                                          '--config.train.eval_every=0']
  done = subprocess.run(
      [sys.executable, 'train.py', f'--config=configs/lra.py:{task},{variant},full',
       f'--workdir={tmp_path}'] + overrides,
      cwd=ROOT, capture_output=True, text=True, timeout=1800, env=one_device_environment())
  assert done.returncode == 0, done.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  trained = [row for row in rows if 'loss' in row]
  assert trained and trained[-1]['step'] == 2 and np.isfinite(trained[-1]['loss'])

"""The phased training schedule (Longformer, sec. 4.2): phases, data, learning rate, train.py.

References: phase boundaries and sizes written out by hand; glued data units
against a `TrainStreams` whose steps are that long; the phased optimizer's
update against the plain optimizer's times the phase's factor; a phased run
killed mid-phase and resumed against the uninterrupted run, bit for bit.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import train as train_script
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.phased_streams import glue_batches
from longformer_jax.data.train_streams import TrainStreams
from longformer_jax.train import phases as phasing
from longformer_jax.train.train_config import TrainConfig
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from tests.support.tiny_models import tiny_config
from tests.support.tree_checks import assert_trees_equal


# Longformer (window 4, x2 in phase 1).
ATTENTION = dict(attention='longformer', window=4)


def phased_config(num_phases=2, phase_steps='2,2'):
  config = tiny_config(**ATTENTION)
  config.train.update(num_steps=4, phases=num_phases, phase_steps=phase_steps, log_every=1,
                      checkpoint_every=2, eval_every=0, phase_length_factor=2,
                      phase_window_factor=2, phase_lr_factor=0.5)
  config.optimizer.update(warmup_steps=1)
  return config


def test_phases_double_length_and_window_and_halve_the_learning_rate():
  config = phased_config(3, '2,3,1')
  config.train.num_steps = 6
  phases = phasing.training_phases(config)
  assert [(p.start_step, p.end_step) for p in phases] == [(0, 2), (2, 5), (5, 6)]
  assert [p.chunk_len for p in phases] == [8, 16, 32]
  assert [p.length_multiple for p in phases] == [1, 2, 4]
  assert [p.window_multiple for p in phases] == [1, 2, 4]
  assert [p.lr_scale for p in phases] == [1.0, 0.5, 0.25]
  assert [phasing.phase_of_step(phases, s).index for s in range(7)] == [0, 0, 1, 1, 1, 2, 2]
  # A state saved after s steps has the shapes of the phase of step s - 1.
  assert [phasing.phase_of_state(phases, s).index for s in range(7)] == [0, 0, 0, 1, 1, 1, 2]
  single = phasing.training_phases(tiny_config())
  assert len(single) == 1 and single[0].chunk_len == 8 and single[0].end_step == 6


@pytest.mark.parametrize('phase_steps,num_steps', [('2,1', 4), ('2,2,0', 4), ('', 5), ('a,b', 4)])
def test_bad_phase_steps_name_the_key(phase_steps, num_steps):
  phases = 2 if phase_steps != '2,2,0' else 3
  with pytest.raises(ConfigError) as error:
    TrainConfig.build({'phases': phases, 'phase_steps': phase_steps, 'num_steps': num_steps},
                      'train')
  assert error.value.key == 'train.phase_steps'


def test_phase_model_config_scales_the_window_and_its_schedule():
  model = ml_collections.ConfigDict({'longformer': {'window': 16}, 'num_heads': 4,
                                     'layer_schedule': {'longformer': {'window': '4,8,16'}}})
  phase = phasing.training_phases(phased_config(3, '1,1,2'))[2]
  scaled = phasing.phase_model_config(model, phase)
  assert scaled.longformer.window == 64
  assert scaled.layer_schedule.longformer.window == '16,32,64'
  assert model.longformer.window == 16 and scaled.num_heads == 4   # the input is not modified
  tuple_schedule = ml_collections.ConfigDict({'longformer': {'window': 4}, 'layer_schedule': {
      'longformer': {'window': (2, 3)}}})
  scaled = phasing.phase_model_config(tuple_schedule, phase)
  assert scaled.layer_schedule.longformer.window == (8, 12)


def test_glued_units_equal_longer_steps_at_the_same_stream_position():
  rng = np.random.default_rng(0)
  docs = [rng.integers(0, 200, rng.integers(5, 60)).astype(np.int32) for _ in range(30)]
  units = TrainStreams(docs, num_rows=4, tokens_per_step=8, seed=3, bos_id=257)
  longer = TrainStreams(docs, num_rows=4, tokens_per_step=32, seed=3, bos_id=257)
  for step in range(5):
    glued = glue_batches([units.batch_at(4 * step + i) for i in range(4)])
    expected = longer.batch_at(step)
    for name in ('inputs', 'targets', 'positions', 'segment_ids', 'doc_start', 'target_mask'):
      np.testing.assert_array_equal(getattr(glued, name), getattr(expected, name), err_msg=name)


def test_phased_optimizer_scales_updates_by_the_phase_factor():
  config = phased_config(2, '2,2')
  phases = phasing.training_phases(config)
  base = make_optimizer(config.optimizer, 4)
  phased = phasing.phased_optimizer(base, phases)
  params = {'w': jnp.ones((3, 3)), 'b': jnp.ones((3,))}
  base_state, phased_state = base.init(params), phased.init(params)
  for step in range(4):
    grads = jax.tree_util.tree_map(lambda p: p * (step + 1) * 0.1, params)
    base_update, base_state = base.update(grads, base_state, params)
    phased_update, phased_state = phased.update(grads, phased_state, params)
    factor = 1.0 if step < 2 else 0.5
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, factor * b, rtol=1e-6),
                           phased_update, base_update)
  lr = phasing.phased_learning_rate(learning_rate_schedule(config.optimizer, 4), phases)
  base_lr = learning_rate_schedule(config.optimizer, 4)
  np.testing.assert_allclose([float(lr(s)) for s in range(4)],
                             [float(base_lr(s)) * f for s, f in zip(range(4), (1, 1, .5, .5))])


def run_phased(workdir: str, stop_after: int = 0):
  config = phased_config()
  config.train.stop_after_steps = stop_after
  state, _ = train_script.train(config, workdir)
  return jax.device_get(state)


@pytest.fixture(scope='module')
def resumed_mid_phase(tmp_path_factory):
  """2 phases of 2 steps, killed after step 3 (inside phase 1) and resumed to the end."""
  workdir = str(tmp_path_factory.mktemp('phased'))
  first = run_phased(workdir, stop_after=3)
  assert int(first.step) == 3
  return workdir, run_phased(workdir)


@pytest.mark.slow
def test_phased_run_changes_chunk_length_and_records_the_phase(resumed_mid_phase):
  workdir, state = resumed_mid_phase
  assert int(state.step) == 4
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  train_lines = [line for line in lines if line['split'] == 'train']
  assert [line['step'] for line in train_lines] == [1, 2, 3, 4]
  assert [line['phase'] for line in train_lines] == [0, 0, 1, 1]
  # 8 rows x 2 chunks x chunk_len 8, then 16.
  assert [line['tokens'] for line in train_lines] == [128, 128, 256, 256]
  lrs = [line['learning_rate'] for line in train_lines]
  base = learning_rate_schedule(phased_config().optimizer, 4)
  np.testing.assert_allclose(lrs, [float(base(s)) * f for s, f in zip(range(4), (1, 1, .5, .5))],
                             rtol=1e-6)
  checkpoints = Checkpointer(workdir, 3)
  recorded = {}
  for step in checkpoints.all_steps():
    with open(os.path.join(checkpoints.directory, str(step), 'data', 'metadata')) as f:
      data_state = json.load(f)
    recorded[step] = (data_state['phase'], data_state['step'])
  # Data positions in phase-0 steps: 1, 2, then 2 units per step.
  assert recorded == {2: (0, 2), 3: (1, 4), 4: (1, 6)}
  if ATTENTION['attention'] == 'longformer':
    # Phase 1's memory has phase 1's shapes: a window cache of 4 x 2 hidden states per row.
    assert [layer.positions.shape for layer in state.memory] == [(8, 8), (8, 8)]


@pytest.mark.slow
def test_eval_restores_a_phased_checkpoint_with_its_phase_shapes(resumed_mid_phase):
  """eval.py reads the last phase's chunk length and window (its memory shapes) for step 4,
  and phase 0's for step 2."""
  from eval import evaluate_run
  workdir, _ = resumed_mid_phase
  config = phased_config()
  config.eval.max_tokens = 128
  assert evaluate_run(config, workdir)['chunk_len'] == 16
  config.eval.step = 2
  assert evaluate_run(config, workdir)['chunk_len'] == 8


@pytest.mark.slow
def test_phased_run_killed_mid_phase_resumes_bit_identically(resumed_mid_phase, tmp_path):
  _, resumed = resumed_mid_phase
  reference = run_phased(str(tmp_path))
  assert int(reference.step) == 4
  assert_trees_equal(resumed.params, reference.params)
  assert_trees_equal(resumed.opt_state, reference.opt_state)
  assert_trees_equal(resumed.memory, reference.memory)

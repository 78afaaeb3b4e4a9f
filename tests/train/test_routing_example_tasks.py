"""Routing attention in a fixed-size-example task: the centroids are model state there too.

A tiny bidirectional routing classifier on the synthetic classification task
(data/classification_tasks.py), trained by train.py's loop in this process for
4 steps with a checkpoint after each:
- a train step moves the centroids exactly as one mutable application of the
  model to the step's batch does (with the step's parameters and dropout key);
  the parameters (what the optimizer sees) hold no centroids;
- the loop's validation equals eval.py's score of the saved checkpoint and a
  float64 reference computed here from the checkpoint's parameters and model
  state (which centroids matters: step 2's score otherwise);
- the run killed after step 2's checkpoint and run again ends bit-identical to
  the run that never stopped, with the same logged metrics;
- a model without model state traces to the jaxprs of the step and the sums as
  they were before (written out here), and its train state has no model state.
The slow test runs train.py (stopped and resumed) and eval.py as commands."""

import functools
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import train as train_script
from longformer_jax.attention.context import MODEL_STATE
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.data.task_batches import TaskBatches
from longformer_jax.evaluation.task_report import evaluate_task_run
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.encoder import encoder_context
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.tasks.classification import label_sums
from longformer_jax.tasks.registry import task_for
from longformer_jax.train import steps
from longformer_jax.train.example_state import abstract_task_state, global_batch_example
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from longformer_jax.train.model_variables import ModelVariables
from longformer_jax.train.train_state import TrainState
from tests.support.repo_paths import REPO_ROOT

ROUTING = {'attention': 'routing', 'causal': False,
           'aux_loss_weights': {'commitment_loss': 0.01},
           # decay 0.5: the centroids move far enough in four steps to change the scores
           'routing': {'num_clusters': 2, 'window': 8, 'local_heads': 1, 'local_window': 4,
                       'decay': 0.5}}


def classification_values(**model) -> dict:
  """A 1-layer, d_model 32 classifier on 16 synthetic 32-token examples, 4 steps of 8
  (sparse values, as a config file)."""
  return {
      'task': 'classification',
      'model': dict({'num_layers': 1, 'd_model': 32, 'num_heads': 2, 'head_dim': 16,
                     'd_ff': 64, 'vocab_multiple': 8, 'dropout_rate': 0.1,
                     'num_classes': 2}, **model),
      'data': {'corpus': 'synthetic', 'seq_len': 32, 'max_examples': 16, 'batch_size': 8,
               'eval_batch_size': 8},
      'optimizer': {'learning_rate': 3e-3, 'warmup_steps': 2},
      'train': {'num_steps': 4, 'log_every': 1, 'eval_every': 2, 'checkpoint_every': 2,
                'async_checkpointing': False, 'eval_max_examples': 16},
      'eval': {'split': 'valid'}}


def classification_config(**model) -> ml_collections.ConfigDict:
  """`classification_values`, resolved."""
  return ml_collections.ConfigDict(resolve_config(classification_values(**model)))


def logged(workdir: str, split: str) -> dict:
  """`{step: metrics}` of `split`'s lines in the run's metrics.jsonl (rates dropped)."""
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  return {line['step']: {k: v for k, v in line.items() if not k.endswith('_per_s')}
          for line in lines if line['split'] == split}


def leaves(tree) -> list:
  return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(jax.device_get(tree))]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """`(config, (workdir, final state) of a 4-step routing run with a checkpoint every step,
  (workdir, final state) of the same run killed after step 2's checkpoint and run again)`.
  The killed run is a copy of the first with checkpoints 3 and 4 removed (its metrics.jsonl
  keeps the later lines, as a run killed before its next checkpoint does)."""
  config = classification_config(**ROUTING)
  config.train.update(checkpoint_every=1, keep_checkpoints=4)
  straight = str(tmp_path_factory.mktemp('straight'))
  straight_state, _ = train_script.train(config, straight)
  resumed = str(tmp_path_factory.mktemp('resumed') / 'run')
  shutil.copytree(straight, resumed)
  for step in (3, 4):
    shutil.rmtree(os.path.join(resumed, 'checkpoints', str(step)))
  resumed_state, _ = train_script.train(config, resumed)
  return config, (straight, straight_state), (resumed, resumed_state)


def restored(runs, step: int) -> TrainState:
  """The train state of checkpoint `step` of the uninterrupted run of `runs`."""
  _, (workdir, final_state), _ = runs
  with Checkpointer(workdir, 4, async_save=False) as checkpointer:
    return checkpointer.restore(step, final_state)[0]     # its shapes and shardings


def test_a_train_step_moves_the_centroids_as_a_mutable_application_does(runs):
  config = runs[0]
  before, after = restored(runs, 2), restored(runs, 3)
  task = task_for('classification')
  tokenizer = task.tokenizer(config.data)
  _, model = task.model(config, tokenizer.vocab_size)
  assert set(before.model_state) == {'encoder'} and not any(
      'centroids' in str(path) for path, _ in jax.tree_util.tree_leaves_with_path(before.params))
  batch = TaskBatches(task.load_arrays(config, 'train', tokenizer), config.data.batch_size,
                      config.seed).batch_at(2)                 # the batch of step 3
  ctx = encoder_context(jnp.asarray(batch['input_mask']), jnp.asarray(batch['global_flags']),
                        False)
  dropout = jax.random.fold_in(before.rng, before.step)
  apply = jax.jit(lambda variables, inputs, ctx, key: model.apply(
      variables, inputs, ctx, rngs={'dropout': key}, mutable=[MODEL_STATE])[1])
  updated = apply({'params': before.params, MODEL_STATE: before.model_state},
                  jnp.asarray(batch['inputs']), ctx, dropout)
  for old, new, want in zip(leaves(before.model_state), leaves(after.model_state),
                            leaves(updated[MODEL_STATE])):
    assert np.abs(new - old).max() > 1e-2              # the centroids moved ...
    np.testing.assert_allclose(new, want, rtol=1e-5, atol=1e-6)   # ... by the step's update


def reference_scores(logits_fn, params, model_state, arrays: dict) -> tuple:
  """`(mean cross-entropy, accuracy)` of the split in float64, from the model's logits."""
  logits = np.asarray(logits_fn({'params': params, MODEL_STATE: model_state}), np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  labels = np.asarray(arrays['label'])
  nll = [-log_probs[i, labels[i]] for i in range(len(labels))]
  return float(np.mean(nll)), float(np.mean(np.argmax(logits, -1) == labels))


def test_validation_equals_eval_of_the_checkpoint_and_a_float64_reference(runs):
  config, (workdir, _), _ = runs
  valid = logged(workdir, 'valid')[4]
  task = task_for('classification')
  report = evaluate_task_run(config, workdir, task)
  assert report['checkpoint_step'] == 4 and report['examples'] == valid['examples'] == 16
  assert (report['loss'], report['accuracy']) == (valid['loss'], valid['accuracy'])
  tokenizer = task.tokenizer(config.data)
  arrays = task.load_arrays(config, 'valid', tokenizer)
  _, model = task.model(config, tokenizer.vocab_size)
  ctx = encoder_context(jnp.asarray(arrays['input_mask']), jnp.asarray(arrays['global_flags']),
                        True)
  logits_fn = jax.jit(lambda variables: model.apply(variables, jnp.asarray(arrays['inputs']),
                                                    ctx)[0])
  saved = restored(runs, 4)
  loss, accuracy = reference_scores(logits_fn, saved.params, saved.model_state, arrays)
  np.testing.assert_allclose(valid['loss'], loss, rtol=1e-5)
  assert valid['accuracy'] == accuracy
  # The latest centroids matter: the same parameters with step 2's score otherwise.
  older = restored(runs, 2).model_state
  assert abs(reference_scores(logits_fn, saved.params, older, arrays)[0] - loss) > 1e-4


def test_stopping_and_resuming_is_bit_identical_to_not_stopping(runs):
  _, (straight, straight_state), (resumed, resumed_state) = runs
  assert int(resumed_state.step) == int(straight_state.step) == 4
  for got, want in zip(leaves(resumed_state), leaves(straight_state)):
    np.testing.assert_array_equal(got, want)
  for split in ('train', 'valid'):
    assert logged(resumed, split) == logged(straight, split)


def sums_before_model_state(model, params, batch: dict, rngs: dict, deterministic: bool):
  """tasks/classification.py's sums as they were before example tasks had model state: the
  model applied with its parameters alone."""
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  logits, aux = model.apply({'params': params}, batch['inputs'], ctx, rngs=rngs)
  return label_sums(model, logits, aux, batch)


def step_before_model_state(state, batch, *, sums_fn, optimizer, learning_rate_fn):
  """train/steps.py's `task_train_step` as it was before example tasks had model state."""
  rng = jax.random.fold_in(state.rng, state.step)

  def objective(params):
    sums = sums_fn(params, batch, {'dropout': rng}, False)
    return sums['loss_sum'] / jnp.maximum(sums['count'], 1.0) + sums['aux_objective'], sums

  grads, sums = jax.grad(objective, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums)
  metrics.update(grad_norm=optax.global_norm(grads),
                 learning_rate=jnp.asarray(learning_rate_fn(state.step), jnp.float32))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def test_a_model_without_model_state_runs_the_programs_it_ran_before():
  """The train step and the evaluation's sums of a model without model state trace to the
  jaxprs of the code before model state (so they compile to the same programs and give the
  same results), and its train state has no model state (checkpoints keep their layout)."""
  config = classification_config(attention='vanilla')
  task = task_for('classification')
  tokenizer = task.tokenizer(config.data)
  arrays = task.load_arrays(config, 'train', tokenizer)
  _, model = task.model(config, tokenizer.vocab_size)
  optimizer = make_optimizer(config.optimizer, config.train.num_steps)
  batch = global_batch_example(arrays, config.data.batch_size)
  state, _, _ = abstract_task_state(model, task.init_arguments, optimizer, config.seed, batch,
                                    make_mesh(config.parallel.mesh_shape),
                                    config.parallel.logical_axis_rules)
  assert state.model_state == {}
  schedule = learning_rate_schedule(config.optimizer, config.train.num_steps)
  sums_fn = task.sums_fn(config, model)
  old_sums = functools.partial(sums_before_model_state, model)
  new = functools.partial(steps.task_train_step, sums_fn=sums_fn, optimizer=optimizer,
                          learning_rate_fn=schedule)
  old = functools.partial(step_before_model_state, sums_fn=old_sums, optimizer=optimizer,
                          learning_rate_fn=schedule)
  jaxpr = lambda f, *args: str(jax.make_jaxpr(f)(*args))
  assert jaxpr(new, state, batch) == jaxpr(old, state, batch)
  assert (jaxpr(lambda p, b: sums_fn(ModelVariables(p), b, {}, True), state.params, batch)
          == jaxpr(lambda p, b: old_sums(p, b, {}, True), state.params, batch))


def run_command(script: str, *flags) -> subprocess.CompletedProcess:
  result = subprocess.run([sys.executable, script, *flags], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.slow
def test_train_py_and_eval_py_keep_the_centroids(tmp_path):
  """train.py stopped at step 2 and run again, then eval.py: eval.py's score is the last
  validation, and the checkpoints hold centroids that moved between steps 2 and 4."""
  config_file = tmp_path / 'routing_classification.py'
  config_file.write_text('import json\n\n\ndef get_config():\n  return json.loads(%r)\n'
                         % json.dumps(classification_values(**ROUTING)))
  workdir = str(tmp_path / 'run')
  flags = [f'--config={config_file}', f'--workdir={workdir}']
  run_command('train.py', *flags, '--config.train.stop_after_steps=2')
  run_command('train.py', *flags)
  run_command('eval.py', *flags)
  report = json.load(open(os.path.join(workdir, 'eval', 'metrics.json')))
  valid = logged(workdir, 'valid')
  assert sorted(valid) == [2, 4] and report['checkpoint_step'] == 4
  assert (report['loss'], report['accuracy']) == (valid[4]['loss'], valid[4]['accuracy'])
  like = task_for('classification').training_task(
      classification_config(**ROUTING)).abstract_state(0)
  with Checkpointer(workdir, 3, async_save=False) as checkpointer:
    centroids = [leaves(checkpointer.restore(step, like)[0].model_state) for step in (2, 4)]
  assert centroids[0] and all(np.abs(a - b).max() > 1e-2 for a, b in zip(*centroids))

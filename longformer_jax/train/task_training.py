"""Training an encoder task (`config.task`: classification, qa, seq2seq); train.py dispatches here.

The loop mirrors the LM loop of train.py: the state (parameters, optimizer,
RNG; no memory, `memory=()`: examples are independent) is created directly in
its shardings, checkpointed with the data position (the step) and resumed
from the latest checkpoint; SIGTERM saves and stops; a non-finite loss stops
without saving. Every `train.eval_every` steps (and at the end) the whole
validation split (at most `train.eval_max_examples`) is scored and written to
`metrics.jsonl` as a `valid` line: accuracy (classification), span F1 and
exact match (qa), token loss and accuracy (seq2seq).
"""

import functools
import math
import os
import time

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding

from longformer_jax.config_errors import require
from longformer_jax.config_validation import validate_config
from longformer_jax.data import classification_tasks, qa_tasks, seq2seq_tasks
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.data.task_batches import TaskBatches, eval_batches
from longformer_jax.models.encoder import (SequenceClassifier, SpanExtractor, encoder_context,
                                           encoder_model_config)
from longformer_jax.models.encoder_decoder import EncoderDecoder, decoder_context
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import task_objectives
from longformer_jax.train.checkpointing import Checkpointer
from longformer_jax.train.loop_checks import check_finite
from longformer_jax.train.metrics_logging import MetricsLogger, ProgressBar
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from longformer_jax.train.preemption import PreemptionWatcher
from longformer_jax.train.train_state import TrainState

TASKS = ('classification', 'qa', 'seq2seq')
TASK_DATA = {'classification': classification_tasks, 'qa': qa_tasks, 'seq2seq': seq2seq_tasks}
TASK_MODELS = {'classification': SequenceClassifier, 'qa': SpanExtractor,
               'seq2seq': EncoderDecoder}


def validate_task_config(config: ml_collections.ConfigDict) -> None:
  require(config.task in TASKS, 'task', f'must be one of lm, {", ".join(TASKS)}; got {config.task!r}')
  data = config.data
  require(data.get('seq_len', 0) >= 4, 'data.seq_len', f'must be >= 4, got {data.get("seq_len")}')
  require(data.get('max_examples', 0) >= 0, 'data.max_examples', 'must be >= 0')
  require(config.optimizer.grad_accum_steps == 1, 'optimizer.grad_accum_steps',
          'task training supports only 1')
  if config.task == 'qa':
    require(0 < data.question_len <= data.seq_len - 3, 'data.question_len',
            f'must be in [1, data.seq_len - 3], got {data.question_len}')
    require(data.max_answer_len >= 1, 'data.max_answer_len', 'must be >= 1')
  if config.task == 'seq2seq':
    require(data.target_len >= 2, 'data.target_len', f'must be >= 2, got {data.target_len}')
    require(config.model.get('decoder_layers', 0) >= 1, 'model.decoder_layers', 'must be >= 1')
  if config.task == 'classification':
    require(config.model.get('num_classes', 0) >= 2, 'model.num_classes', 'must be >= 2')


def global_tokens_needed(config: ml_collections.ConfigDict) -> int:
  """Global tokens per example of the task: [CLS], or [CLS] question [SEP] for QA."""
  return config.data.question_len + 2 if config.task == 'qa' else 1


def task_model(config: ml_collections.ConfigDict, vocab_size: int):
  """`(model_config, model)` of `config.task`.

  `model.longformer.global_tokens = 0` becomes the task's number of global
  tokens (`global_tokens_needed`), the capacity Longformer attention reserves.
  """
  overrides = {}
  longformer = config.model.longformer
  if not longformer.global_tokens:
    overrides['longformer'] = dict(longformer.to_dict(), global_tokens=global_tokens_needed(config))
  model_config = encoder_model_config(config.model, vocab_size, **overrides)
  return model_config, TASK_MODELS[config.task](model_config)


def task_sums_fn(config: ml_collections.ConfigDict, model):
  """`(params, batch, rngs, deterministic) -> sums` of `config.task` (task_objectives)."""
  sums = task_objectives.TASK_SUMS[config.task]
  if config.task == 'qa':
    sums = functools.partial(sums, max_answer_len=config.data.max_answer_len)
  return functools.partial(sums, model)


def init_arguments(task: str, batch: dict) -> tuple:
  """The positional arguments of the task model's `__call__` for `batch` (for `init`)."""
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], True)
  if task == 'seq2seq':
    return (batch['inputs'], ctx, batch['decoder_inputs'],
            decoder_context(batch['decoder_mask'], True))
  return batch['inputs'], ctx


def batch_shardings(example_batch: dict, mesh, rules) -> dict:
  """Each array sharded over its leading `batch` axis."""
  def spec(array):
    names = ('batch',) + (None,) * (np.ndim(array) - 1)
    return NamedSharding(mesh, nn.logical_to_mesh_axes(names, sharding.rules_tuple(rules)))
  return {name: spec(value) for name, value in example_batch.items()}


def to_global(local: dict, shardings: dict) -> dict:
  return {name: jax.make_array_from_process_local_data(shardings[name], value)
          for name, value in local.items()}


def abstract_task_state(task: str, model, optimizer, seed: int, example_batch: dict, mesh, rules):
  """`(abstract, shardings, create)`: the train state's shapes and shardings, and its initialiser."""
  dummy = {name: jnp.zeros(value.shape, value.dtype) for name, value in example_batch.items()}

  def create_boxed(key):
    init_key, state_key = jax.random.split(key)
    params = model.init({'params': init_key}, *init_arguments(task, dummy))['params']
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), memory=(), rng=state_key)

  boxed = jax.eval_shape(create_boxed, jax.random.PRNGKey(seed))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    nn.meta.unbox(boxed), shardings)
  create = jax.jit(lambda key: nn.meta.unbox(create_boxed(key)), out_shardings=shardings)
  return abstract, shardings, create


def task_train_step(state: TrainState, batch: dict, *, sums_fn, optimizer, learning_rate_fn):
  """One update on the mean task loss plus the weighted auxiliary losses."""
  rng = jax.random.fold_in(state.rng, state.step)

  def objective(params):
    sums = sums_fn(params, batch, {'dropout': rng}, False)
    return sums['loss_sum'] / jnp.maximum(sums['count'], 1.0) + sums['aux_objective'], sums

  grads, sums = jax.grad(objective, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {name: value for name, value in sums.items()}
  metrics.update(grad_norm=optax.global_norm(grads),
                 learning_rate=jnp.asarray(learning_rate_fn(state.step), jnp.float32))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def host_train_metrics(task: str, sums: dict) -> dict:
  """Train-line metrics of one step: the task metrics of its batch, grad norm, learning rate."""
  sums = jax.tree_util.tree_map(float, jax.device_get(sums))
  metrics = task_objectives.eval_metrics(task, sums)
  metrics.update(grad_norm=sums['grad_norm'], learning_rate=sums['learning_rate'])
  return metrics


class TaskEvaluator:
  """Scores a whole split with one compiled step; rows split over processes like training."""

  def __init__(self, config, sums_fn, arrays: dict, shardings: dict, param_shardings, mesh):
    self.task = config.task
    self.arrays = arrays
    self.batch_size = config.data.eval_batch_size
    self.max_examples = config.train.get('eval_max_examples', 0)
    self.shardings = shardings
    rows = self.batch_size // jax.process_count()
    self.rows = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    self._step = jax.jit(lambda params, batch: sums_fn(params, batch, {}, True),
                         in_shardings=(param_shardings, shardings),
                         out_shardings=sharding.replicated(mesh))

  def evaluate(self, params) -> dict:
    totals = None
    for batch in eval_batches(self.arrays, self.batch_size, self.max_examples):
      local = {name: value[self.rows] for name, value in batch.items()}
      sums = self._step(params, to_global(local, self.shardings))
      totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
    totals = jax.tree_util.tree_map(lambda x: float(np.asarray(x)), totals)
    return task_objectives.eval_metrics(self.task, totals)


def train_task(config: ml_collections.ConfigDict, workdir: str):
  """Runs (or resumes) task training; returns `(final TrainState, last logged metrics)`."""
  # ---- set-up: devices, config, data -----------------------------------
  if config.parallel.multi_host:
    jax.distributed.initialize()
  validate_config(config, jax.device_count())
  validate_task_config(config)
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))
  task = config.task
  tokenizer = make_tokenizer(config.data)
  data_module = TASK_DATA[task]
  train_arrays = data_module.load_arrays(config, 'train', tokenizer)
  valid_arrays = data_module.load_arrays(config, 'valid', tokenizer)
  batches = TaskBatches(train_arrays, config.data.batch_size, config.seed, jax.process_index(),
                        jax.process_count())
  logging.info('Task %s: %d train, %d valid examples', task, batches.num_examples,
               len(valid_arrays['weight']))

  # ---- model, optimizer, mesh, state -----------------------------------
  model_config, model = task_model(config, tokenizer.vocab_size)
  num_steps = config.train.num_steps
  optimizer = make_optimizer(config.optimizer, num_steps)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  example = batches.batch_at(0)
  global_example = {name: np.zeros((config.data.batch_size,) + value.shape[1:], value.dtype)
                    for name, value in example.items()}
  abstract_state, state_shardings, create_state = abstract_task_state(
      task, model, optimizer, config.seed, global_example, mesh, rules)
  checkpointer = Checkpointer(workdir, config.train.keep_checkpoints,
                              async_save=config.train.async_checkpointing)
  if checkpointer.latest_step() is not None:
    state, data_state = checkpointer.restore(None, abstract_state)
    batches.restore(data_state)
    logging.info('Resumed from step %d in %s', int(state.step), checkpointer.directory)
  else:
    state = create_state(jax.random.PRNGKey(config.seed))
  start_step = int(state.step)

  # ---- compiled steps --------------------------------------------------
  shardings = batch_shardings(global_example, mesh, rules)
  sums_fn = task_sums_fn(config, model)
  train_step = jax.jit(
      functools.partial(task_train_step, sums_fn=sums_fn, optimizer=optimizer,
                        learning_rate_fn=learning_rate_schedule(config.optimizer, num_steps)),
      in_shardings=(state_shardings, shardings),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)
  evaluator = TaskEvaluator(config, sums_fn, valid_arrays, shardings, state_shardings.params, mesh)

  # ---- the loop ----------------------------------------------------------
  end_step = min(num_steps, config.train.stop_after_steps or num_steps)
  is_chief = jax.process_index() == 0
  logger = MetricsLogger(workdir, enabled=is_chief)
  progress = ProgressBar(num_steps, start_step, enabled=is_chief)
  last, last_valid = {}, (None, None)
  window_start, window_steps = time.time(), 0

  def evaluate(step):
    result = evaluator.evaluate(state.params)
    logger.write(step, result, 'valid')
    return step, result

  try:
    with PreemptionWatcher() as preemption, sharding.activation_sharding(mesh, rules):
      step = start_step
      while step < end_step:
        state, sums = train_step(state, to_global(batches.next_batch(), shardings))
        step += 1
        window_steps += 1
        if step % config.train.log_every == 0 or step == end_step:
          last = host_train_metrics(task, sums)
          check_finite(step, last)
          last['examples_per_s'] = (window_steps * config.data.batch_size
                                    / max(time.time() - window_start, 1e-9))
          logger.write(step, last, 'train')
          progress.update(step, last['loss'], last['loss'] / math.log(2), last['examples_per_s'])
          window_start, window_steps = time.time(), 0
        if config.train.eval_every and step % config.train.eval_every == 0:
          last_valid = evaluate(step)
        if step % config.train.checkpoint_every == 0 or preemption.requested:
          check_finite(step, host_train_metrics(task, sums))   # never save a non-finite state
          checkpointer.save(step, state, batches.state())
        if preemption.requested:
          logging.warning('SIGTERM at step %d: checkpoint saved, stopping.', step)
          break
      checkpointer.save(step, state, batches.state())
      if step == num_steps and config.train.eval_every:
        if last_valid[0] != step:
          last_valid = evaluate(step)
        last['final_valid'] = last_valid[1]
  finally:
    checkpointer.wait()
    checkpointer.close()
    progress.close()
    logger.close()
  last['step'] = step
  return state, last

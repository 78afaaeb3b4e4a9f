"""Tiny encoder tasks (classification, QA, seq2seq) on synthetic 32-token examples: their
configs, as tests build them and as train.py checks them, and a few steps of training
in-process."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.experiment_config import resolve_config
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.task_batches import TaskBatches, eval_batches
from longformer_jax.tasks.registry import task_for
from longformer_jax.train import steps
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from longformer_jax.train.model_variables import ModelVariables
from longformer_jax.train.train_state import TrainState
from tests.support.tiny_models import tiny_config

TOKENIZER = ByteTokenizer()


# train.py validates data.question_len (default 64) against seq_len for every task.
VALID_SEQ_LEN = 68
# Each task gets only the settings it reads (the config rejects ignored ones).
TASK_DATA_SETTINGS = {'classification': {}, 'qa': dict(question_len=3, max_answer_len=8),
                      'seq2seq': dict(target_len=12), 'masked_pretraining': {}}
TASK_MODEL_SETTINGS = {'classification': dict(num_classes=2), 'qa': {},
                       'seq2seq': dict(decoder_layers=1), 'masked_pretraining': {}}


def tiny_task_config(task: str, **data_overrides) -> ml_collections.ConfigDict:
  """A 2-layer, d_model 32 bidirectional encoder on a synthetic task of 32-token examples."""
  config = tiny_config(attention='vanilla', mem_len=0)
  config.task = task
  config.data.update(corpus='synthetic', seq_len=32, max_examples=512, tfds_config='')
  config.data.update(**dict(TASK_DATA_SETTINGS[task], **data_overrides))
  config.model.update(**TASK_MODEL_SETTINGS[task])
  config.optimizer.update(learning_rate=3e-3, warmup_steps=10)
  config.train.update(eval_max_examples=256)
  return config


def trainable_task_config(task: str, **data_overrides) -> ml_collections.ConfigDict:
  """`tiny_task_config` as train.py checks it: only the settings the task reads, resolved."""
  model = tiny_config(attention='vanilla', mem_len=0).model.to_dict()
  model.update(TASK_MODEL_SETTINGS[task])
  values = dict(
      task=task, model=model,
      data=dict(corpus='synthetic', seq_len=VALID_SEQ_LEN, max_examples=512, batch_size=8,
                eval_batch_size=8, **dict(TASK_DATA_SETTINGS[task], **data_overrides)),
      optimizer=dict(learning_rate=3e-3, warmup_steps=10),
      train=dict(num_steps=6, log_every=2, eval_every=0, checkpoint_every=3,
                 async_checkpointing=False, eval_max_examples=256))
  return ml_collections.ConfigDict(resolve_config(values))


def fit(config, num_steps: int):
  """Trains on the task's synthetic train split in-process (no mesh, no checkpoints).

  Returns `(valid metrics before, valid metrics after)`.
  """
  data = task_for(config.task)
  train_arrays = data.load_arrays(config, 'train', TOKENIZER)
  valid_arrays = data.load_arrays(config, 'valid', TOKENIZER)
  _, model = task_for(config.task).model(config, TOKENIZER.vocab_size)
  optimizer = make_optimizer(config.optimizer, num_steps)
  batches = TaskBatches(train_arrays, config.data.batch_size, config.seed)
  example = {k: jnp.asarray(v) for k, v in batches.batch_at(0).items()}
  params = nn.meta.unbox(model.init({'params': jax.random.PRNGKey(0)},
                                    *task_for(config.task).init_arguments(example))['params'])
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                     memory=(), rng=jax.random.PRNGKey(1))
  sums_fn = task_for(config.task).sums_fn(config, model)
  step_fn = jax.jit(functools.partial(
      steps.task_train_step, sums_fn=sums_fn, optimizer=optimizer,
      learning_rate_fn=learning_rate_schedule(config.optimizer, num_steps)))
  eval_fn = jax.jit(lambda p, b: sums_fn(ModelVariables(p), b, {}, True))

  def evaluate(params):
    totals = None
    for batch in eval_batches(valid_arrays, config.data.eval_batch_size, 256):
      sums = eval_fn(params, batch)
      totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
    return task_for(config.task).metrics(jax.tree_util.tree_map(float, totals))

  before = evaluate(state.params)
  for _ in range(num_steps):
    state, _ = step_fn(state, batches.next_batch())
  return before, evaluate(state.params)

"""The fixed-size-example tasks' data, models and train state: classification, qa, seq2seq (LED),
image (a causal decoder over one image, `train/image_task.py`), HIBERT's sentence_mask and
extractive (documents as sentences, `train/hibert_task.py`).

`task_model` builds the task's model (`SequenceClassifier`, `SpanExtractor`,
`EncoderDecoder`) with the global tokens the task needs;
`abstract_task_state` gives the train state's shapes and shardings (no
memory: `memory=()`, examples are independent) and its jitted initialiser;
`task_sums_fn` is the task's loss and metric sums (`train/task_objectives.py`).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.config.errors import require
from longformer_jax.data import classification_tasks, image_data, qa_tasks, seq2seq_tasks
from longformer_jax.models.encoder import (SequenceClassifier, SpanExtractor, encoder_context,
                                           encoder_model_config)
from longformer_jax.models.encoder_decoder import EncoderDecoder, decoder_context
from longformer_jax.parallel import sharding
from longformer_jax.train import hibert_task, image_task, task_objectives
from longformer_jax.train.train_state import TrainState

TASKS = ('classification', 'qa', 'seq2seq', 'image') + hibert_task.TASKS
TASK_DATA = {'classification': classification_tasks, 'qa': qa_tasks, 'seq2seq': seq2seq_tasks,
             'image': image_data, **{task: hibert_task for task in hibert_task.TASKS}}
TASK_MODELS = {'classification': SequenceClassifier, 'qa': SpanExtractor,
               'seq2seq': EncoderDecoder, 'image': image_task.ImageDecoder}


def validate_task_config(config: ml_collections.ConfigDict) -> None:
  """The task settings the config schema does not check yet (one `ConfigError` each)."""
  require(config.task in TASKS, 'task', f'must be one of lm, {", ".join(TASKS)}; got {config.task!r}')
  data = config.data
  require(data.seq_len >= 4, 'data.seq_len', f'must be >= 4, got {data.seq_len}')
  require(data.max_examples >= 0, 'data.max_examples', 'must be >= 0')
  require(config.optimizer.grad_accum_steps == 1, 'optimizer.grad_accum_steps',
          'task training supports only 1')
  if config.task == 'qa':
    require(0 < data.question_len <= data.seq_len - 3, 'data.question_len',
            f'must be in [1, data.seq_len - 3], got {data.question_len}')
    require(data.max_answer_len >= 1, 'data.max_answer_len', 'must be >= 1')
  if config.task == 'seq2seq':
    require(data.target_len >= 2, 'data.target_len', f'must be >= 2, got {data.target_len}')
    require(config.model.decoder_layers >= 1, 'model.decoder_layers', 'must be >= 1')
  if config.task == 'classification':
    require(config.model.num_classes >= 2, 'model.num_classes', 'must be >= 2')


def global_tokens_needed(config: ml_collections.ConfigDict) -> int:
  """Global tokens per example of the task: [CLS], or [CLS] question [SEP] for QA."""
  return config.data.question_len + 2 if config.task == 'qa' else 1


def task_model(config: ml_collections.ConfigDict, vocab_size: int):
  """`(model_config, model)` of `config.task`.

  `model.longformer.global_tokens = 0` becomes the task's number of global
  tokens (`global_tokens_needed`), the capacity Longformer attention reserves.
  The image task ignores `vocab_size` (its vocabulary is the intensities + BOS).
  """
  if config.task == 'image':
    return image_task.image_model(config)
  if config.task in hibert_task.TASKS:
    return hibert_task.hibert_model(config, vocab_size)
  overrides = {}
  longformer = config.model.longformer
  if not longformer.global_tokens:
    overrides['longformer'] = dict(longformer.to_dict(), global_tokens=global_tokens_needed(config))
  model_config = encoder_model_config(config.model, vocab_size, **overrides)
  return model_config, TASK_MODELS[config.task](model_config)


def task_sums_fn(config: ml_collections.ConfigDict, model):
  """`(params, batch, rngs, deterministic) -> sums` of `config.task` (task_objectives)."""
  if config.task == 'image':
    return image_task.image_sums_fn(config, model)
  if config.task in hibert_task.TASKS:
    return hibert_task.hibert_sums_fn(config, model)
  sums = task_objectives.TASK_SUMS[config.task]
  if config.task == 'qa':
    sums = functools.partial(sums, max_answer_len=config.data.max_answer_len)
  return functools.partial(sums, model)


def init_arguments(task: str, batch: dict) -> tuple:
  """The positional arguments of the task model's `__call__` for `batch` (for `init`)."""
  if task == 'image':
    return batch['inputs'], image_task.image_context(batch['inputs'], True)
  if task in hibert_task.TASKS:
    return hibert_task.init_arguments(task, batch)
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], True)
  if task == 'seq2seq':
    return (batch['inputs'], ctx, batch['decoder_inputs'],
            decoder_context(batch['decoder_mask'], True))
  return batch['inputs'], ctx


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

"""The whole experiment config: its sections, checked before anything is built.

  seed, task                 top-level settings (task: tasks/registry.py)
  data                       data/data_config.py
  model                      models/model_config.py (with one section per variant)
  optimizer                  train/optimizer_config.py
  train                      train/train_config.py
  checkpoint                 checkpoint/checkpoint_config.py
  parallel                   parallel/parallel_config.py
  eval                       evaluation/eval_config.py

`resolve_config(values)` takes a sparse mapping (what a file in `configs/`
and the command line set) and returns the complete plain dict; each section
checks its own values, and this module checks only what spans sections (a
data setting the task does not read, the chunk lengths the model sees, how
the batch splits) and asks the task (tasks/base.py) for its own checks.
`validate_config` does the same for a `ConfigDict` and completes it in place.
Checks that need the device count (the mesh) take it as an argument, so they
run in tests without devices.
"""

from typing import Mapping, Optional

import ml_collections

from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.config.section import coerce, unknown_key_error
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.data.data_config import DataConfig
from longformer_jax.evaluation.eval_config import EvalConfig
from longformer_jax.models.hibert import HibertConfig
from longformer_jax.models.model_config import ModelConfig, resolve_model
from longformer_jax.models.saved_config import plain_dict
from longformer_jax.parallel.mesh import mesh_axis_sizes
from longformer_jax.parallel.parallel_config import ParallelConfig, check_sequence_split
from longformer_jax.tasks.registry import readers, task_for, task_keys
from longformer_jax.train.optimizer_config import OptimizerConfig
from longformer_jax.train.train_config import TrainConfig, int_list

SECTIONS = {'data': DataConfig, 'optimizer': OptimizerConfig, 'train': TrainConfig,
            'checkpoint': CheckpointConfig, 'parallel': ParallelConfig, 'eval': EvalConfig}
TOP_LEVEL = ('seed', 'task', 'model') + tuple(SECTIONS)


def chunk_lengths(task: str, data: DataConfig, train: TrainConfig, eval_: EvalConfig,
                  hibert: HibertConfig = HibertConfig()) -> tuple:
  """Every chunk length the model will see (the task's `chunk_lengths`: training phases and
  evaluation for lm; tasks: seq_len; image: the positions of one image of `data.corpus`;
  HIBERT: sentence tokens and sentences)."""
  return task_for(task).chunk_lengths(data, train, eval_, hibert)


def resolve_config(values: Mapping) -> dict:
  """The complete, checked experiment config from a (possibly sparse) mapping."""
  values = plain_dict(values)
  for key in values:
    if key not in TOP_LEVEL:
      raise unknown_key_error('', key, TOP_LEVEL)
  # The seed as any section's int field: `--config.seed=1` arrives as the string '1'.
  seed, task_name = coerce(values.get('seed', 0), int, 'seed'), values.get('task', 'lm')
  task = task_for(task_name)
  sections = {name: cls.build(values.get(name), name) for name, cls in SECTIONS.items()}
  data, train = sections['data'], sections['train']
  _check_task_keys(task, data, train, values)
  task.check_data(data)
  model_values = dict(values.get('model') or {})
  hibert = _hibert_section(task, model_values)
  model = resolve_model(model_values, 'model',
                        task.chunk_lengths(data, train, sections['eval'], hibert))
  _check_model_for_task(task, model)
  task.check_model(data, model)
  task.complete_model(model, hibert)
  accum = sections['optimizer'].grad_accum_steps
  require(data.batch_size % accum == 0, 'optimizer.grad_accum_steps',
          f'{accum} must divide data.batch_size={data.batch_size}')
  require(task.accumulates_gradients or accum == 1, 'optimizer.grad_accum_steps',
          f'{accum}: task training supports only 1')
  resolved = {'seed': seed, 'task': task.name, 'model': model}
  resolved.update({name: section.to_dict() for name, section in sections.items()})
  return resolved


def _check_task_keys(task, data: DataConfig, train: TrainConfig, values: Mapping) -> None:
  """A data or train setting the task does not read is an error, not silently ignored
  (the settings only some tasks read: their `data_keys` and `train_keys`)."""
  defaults = DataConfig()
  for name in task_keys('data_keys'):
    if name not in task.data_keys and getattr(data, name) != getattr(defaults, name):
      raise ConfigError(f'data.{name}', f'{getattr(data, name)!r} is ignored: only task '
                        f'{" or ".join(readers("data_keys", name))} reads it '
                        f'(task is {task.name!r})')
  given = dict(values.get('train') or {})
  for name in task_keys('train_keys'):
    if (name not in task.train_keys and name in given
        and getattr(train, name) != getattr(TrainConfig(), name)):
      raise ConfigError(f'train.{name}',
                        f'{getattr(train, name)!r} is ignored by task {task.name!r}')


def _hibert_section(task, model_values: dict) -> HibertConfig:
  """`model.hibert` (popped from `model_values`): its keys the task does not read (its
  `hibert_keys`) are errors; then the task checks the model settings it was given."""
  hibert = HibertConfig.build(model_values.pop('hibert', None), 'model.hibert')
  defaults = HibertConfig()
  for name in HibertConfig.field_names():
    value = getattr(hibert, name)
    if name in task.hibert_keys or value == getattr(defaults, name):
      continue
    if not task.hibert_keys:
      raise ConfigError(f'model.hibert.{name}', f'{value!r} is ignored: only tasks '
                        f'{" and ".join(readers("hibert_keys"))} read model.hibert '
                        f'(task is {task.name!r})')
    raise ConfigError(f'model.hibert.{name}', f'{value!r} is ignored: only task '
                      f'{readers("hibert_keys", name)[0]!r} reads it (task is {task.name!r})')
  task.check_model_values(model_values)
  return hibert


def _check_model_for_task(task, model: dict) -> None:
  """The model settings only some tasks read (their `model_keys`), and routing's model state."""
  for key in ('num_classes', 'decoder_layers'):
    if key not in task.model_keys and model[key]:
      raise ConfigError(f'model.{key}', f'{model[key]} is ignored by task {task.name!r}')
  if 'pooling' not in task.model_keys and model['pooling'] != ModelConfig.pooling:
    raise ConfigError('model.pooling', f"{model['pooling']!r} is read by task "
                      f'{" or ".join(repr(n) for n in readers("model_keys", "pooling"))} '
                      f'only (task is {task.name!r})')
  if 'logits_bias' not in task.model_keys and model.get('logits_bias'):
    raise ConfigError('model.logits_bias', f'is read by task '
                      f'{" or ".join(repr(n) for n in readers("model_keys", "logits_bias"))} '
                      f'only (task is {task.name!r})')
  scheduled = str(dict(model.get('layer_schedule') or {}).get('attention', ''))
  attentions = {model['attention']} | {name.strip() for name in scheduled.split(',')}
  if not task.carries_model_state and 'routing' in attentions:
    keepers = readers('carries_model_state')
    who = (f"task {keepers[0]!r} does" if len(keepers) == 1 else
           f"tasks {', '.join(repr(n) for n in keepers)} do")
    raise ConfigError('model.attention', f"routing keeps its centroids as model state, which "
                      f"task {task.name!r} does not carry ({who})")


def validate_config(config: ml_collections.ConfigDict,
                    device_count: Optional[int] = None) -> ml_collections.ConfigDict:
  """Checks `config`, completes it in place with every default, and returns it.

  Raises `ConfigError` (one line: the dotted key, the value, the rule) for
  the first invalid value found.
  """
  resolved = resolve_config(config)
  if isinstance(config, ml_collections.ConfigDict) and not isinstance(
      config, ml_collections.FrozenConfigDict):
    for key in list(config.keys()):
      del config[key]
    for key, value in resolved.items():
      config[key] = value
  else:
    config = ml_collections.ConfigDict(resolved)
  if device_count is not None:
    validate_mesh(config, device_count)
  return config


def validate_mesh(config: ml_collections.ConfigDict, device_count: int) -> None:
  """The mesh fills the devices, and the sharded sizes divide evenly."""
  sizes = mesh_axis_sizes(config.parallel.mesh_shape, device_count)
  data, fsdp, tensor = sizes['data'], sizes['fsdp'], sizes['tensor']
  if sizes['sequence'] > 1:
    built = {name: SECTIONS[name].build(config[name].to_dict(), name)
             for name in ('data', 'train', 'eval')}
    check_sequence_split(chunk_lengths(config.task, built['data'], built['train'], built['eval']),
                         sizes['sequence'], config.parallel.load_balance and config.model.causal)
  for key in ('data.batch_size', 'data.eval_batch_size'):
    section, name = key.split('.')
    rows = config[section][name]
    require(rows % (data * fsdp) == 0, key,
            f'{rows} rows cannot be split over data x fsdp = {data * fsdp} devices')
  micro_rows = config.data.batch_size // config.optimizer.grad_accum_steps
  require(micro_rows % (data * fsdp) == 0, 'optimizer.grad_accum_steps',
          f'micro-batches of {micro_rows} rows cannot be split over {data * fsdp} devices')
  model = config.model
  require(model.d_model % fsdp == 0, 'model.d_model',
          f'{model.d_model} is not divisible by the fsdp axis ({fsdp})')
  for key, size in (('model.num_heads', model.num_heads), ('model.d_ff', model.d_ff),
                    ('model.vocab_multiple', model.vocab_multiple)):
    require(size % tensor == 0, key, f'{size} is not divisible by the tensor axis ({tensor})')


def parse_int_list(text, key: str) -> list[int]:
  """'0,128,512' (or an int, or '') -> [0, 128, 512]; bad items name `key`."""
  try:
    return int_list(text)
  except ValueError:
    raise ConfigError(key, f'{text!r} must be a comma-separated list of integers') from None

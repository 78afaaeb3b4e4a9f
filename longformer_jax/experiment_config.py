"""The whole experiment config: its sections, checked before anything is built.

  seed, task                 top-level settings
  data                       data/data_config.py
  model                      models/model_config.py (with one section per variant)
  optimizer                  train/optimizer_config.py
  train                      train/train_config.py
  parallel                   parallel/parallel_config.py
  eval                       evaluation/eval_config.py

`resolve_config(values)` takes a sparse mapping (what a file in `configs/`
and the command line set) and returns the complete plain dict; each section
checks its own values, and this module checks only what spans sections (a
data setting the task does not read, the chunk lengths the model sees, how
the batch splits). `validate_config` does the same for a `ConfigDict` and
completes it in place. Checks that need the device count (the mesh) take it
as an argument, so they run in tests without devices.
"""

from typing import Mapping, Optional

import ml_collections

from longformer_jax.config.section import unknown_key_error
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.data.data_config import TASK_KEYS, DataConfig
from longformer_jax.data.image_data import image_source
from longformer_jax.evaluation.eval_config import EvalConfig
from longformer_jax.models.hibert import HIBERT_TASKS, HibertConfig
from longformer_jax.models.model_config import ModelConfig, resolve_model
from longformer_jax.models.saved_config import plain_dict
from longformer_jax.parallel.mesh import mesh_axis_sizes
from longformer_jax.parallel.parallel_config import ParallelConfig, check_sequence_split
from longformer_jax.train.optimizer_config import OptimizerConfig
from longformer_jax.train.train_config import TrainConfig, int_list

TASKS = ('lm', 'classification', 'qa', 'seq2seq', 'image') + HIBERT_TASKS
SECTIONS = {'data': DataConfig, 'optimizer': OptimizerConfig, 'train': TrainConfig,
            'parallel': ParallelConfig, 'eval': EvalConfig}
TOP_LEVEL = ('seed', 'task', 'model') + tuple(SECTIONS)


def chunk_lengths(task: str, data: DataConfig, train: TrainConfig, eval_: EvalConfig,
                  hibert: HibertConfig = HibertConfig()) -> tuple:
  """Every chunk length the model will see: training phases, evaluation (tasks: seq_len;
  image: the positions of one image of `data.corpus`; HIBERT: sentence tokens and sentences)."""
  if task in HIBERT_TASKS:
    return tuple(sorted({hibert.max_sentence_tokens, hibert.max_sentences}))
  if task == 'image':
    return (image_source(data.corpus).length,)
  if task != 'lm':
    return (data.seq_len,)
  lengths = {data.chunk_len * train.phase_length_factor ** p for p in range(train.phases)}
  if eval_.chunk_len:
    lengths.add(eval_.chunk_len)
  return tuple(sorted(lengths))


def resolve_config(values: Mapping) -> dict:
  """The complete, checked experiment config from a (possibly sparse) mapping."""
  values = plain_dict(values)
  for key in values:
    if key not in TOP_LEVEL:
      raise unknown_key_error('', key, TOP_LEVEL)
  seed, task = values.get('seed', 0), values.get('task', 'lm')
  require(isinstance(seed, int) and not isinstance(seed, bool), 'seed',
          f'{seed!r} must be an integer')
  require(task in TASKS, 'task', f'{task!r} is not a task; choose one of {TASKS}')
  sections = {name: cls.build(values.get(name), name) for name, cls in SECTIONS.items()}
  data, train = sections['data'], sections['train']
  _check_task_keys(task, data, train, values)
  model_values = dict(values.get('model') or {})
  hibert = _hibert_section(task, model_values)
  model = resolve_model(model_values, 'model',
                        chunk_lengths(task, data, train, sections['eval'], hibert))
  _check_model_for_task(task, model)
  if task in HIBERT_TASKS:
    model['hibert'] = hibert.to_dict()
  if task == 'image':
    _check_image_model(data, model)
  accum = sections['optimizer'].grad_accum_steps
  require(data.batch_size % accum == 0, 'optimizer.grad_accum_steps',
          f'{accum} must divide data.batch_size={data.batch_size}')
  require(task == 'lm' or accum == 1, 'optimizer.grad_accum_steps',
          f'{accum}: task training supports only 1')
  resolved = {'seed': seed, 'task': task, 'model': model}
  resolved.update({name: section.to_dict() for name, section in sections.items()})
  return resolved


def _check_task_keys(task: str, data: DataConfig, train: TrainConfig, values: Mapping) -> None:
  """A data or train setting the task does not read is an error, not silently ignored."""
  defaults = DataConfig()
  for name, tasks in TASK_KEYS.items():
    if task not in tasks and getattr(data, name) != getattr(defaults, name):
      raise ConfigError(f'data.{name}', f'{getattr(data, name)!r} is ignored: only '
                        f'task {" or ".join(tasks)} reads it (task is {task!r})')
  if task == 'qa':   # checked here: only the qa task reads question_len
    require(data.question_len <= data.seq_len - 3, 'data.question_len',
            f'{data.question_len} must be in [1, seq_len - 3 = {data.seq_len - 3}]')
  lm_only = ('eval_max_tokens', 'phases', 'phase_steps', 'phase_length_factor',
             'phase_window_factor', 'phase_lr_factor')
  given = dict(values.get('train') or {})
  if task not in ('classification', 'qa', 'seq2seq'):
    lm_only += ('init_from_hf',)
  for name in lm_only if task != 'lm' else ('eval_max_examples', 'init_from_hf'):
    if name in given and getattr(train, name) != getattr(TrainConfig(), name):
      raise ConfigError(f'train.{name}', f'{getattr(train, name)!r} is ignored by task {task!r}')


def _hibert_section(task: str, model_values: dict) -> HibertConfig:
  """`model.hibert` (popped from `model_values`), checked for `task`; HIBERT's encoders take their
  depths from it, so `model.num_layers` and `model.layer_schedule` are errors there."""
  hibert = HibertConfig.build(model_values.pop('hibert', None), 'model.hibert', task)
  if task in HIBERT_TASKS:
    for key in ('num_layers', 'layer_schedule'):
      if model_values.get(key, getattr(ModelConfig(), key)) != getattr(ModelConfig(), key):
        raise ConfigError(f'model.{key}', f'{model_values[key]!r} is ignored by task {task!r}: '
                          'set model.hibert.sentence_layers and model.hibert.document_layers')
  return hibert


def _check_image_model(data: DataConfig, model: dict) -> None:
  """Task image: a causal model; 2D image_local attention sized to the images of `data.corpus`."""
  require(model['causal'], 'model.causal', 'False: task image trains a causal decoder')
  source = image_source(data.corpus)
  section = model.get('image_local') or {}
  if model['attention'] != 'image_local' or section.get('layout') != '2d':
    return
  for key, want in (('image_height', source.height), ('image_width', source.row_len)):
    require(section[key] == want, f'model.image_local.{key}',
            f'{section[key]} must be {want} for {data.corpus!r} images of {source.height} x '
            f'{source.width} x {source.channels} (width counts channels)')


def _check_model_for_task(task: str, model: dict) -> None:
  if task == 'classification':
    require(model['num_classes'] >= 2, 'model.num_classes',
            f"{model['num_classes']} must be >= 2 for task 'classification'")
  elif model['num_classes']:
    raise ConfigError('model.num_classes', f"{model['num_classes']} is ignored by task {task!r}")
  if task == 'seq2seq':
    require(model['decoder_layers'] >= 1, 'model.decoder_layers',
            f"{model['decoder_layers']} must be >= 1 for task 'seq2seq'")
  elif model['decoder_layers']:
    raise ConfigError('model.decoder_layers',
                      f"{model['decoder_layers']} is ignored by task {task!r}")
  if task != 'seq2seq' and model.get('logits_bias'):
    raise ConfigError('model.logits_bias', f"is read by task 'seq2seq' only (task is {task!r})")
  scheduled = str(dict(model.get('layer_schedule') or {}).get('attention', ''))
  attentions = {model['attention']} | {name.strip() for name in scheduled.split(',')}
  if task != 'lm' and 'routing' in attentions:
    raise ConfigError('model.attention', f"routing keeps its centroids as model state, which "
                      f"only task 'lm' carries (task is {task!r})")


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

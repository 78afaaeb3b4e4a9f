"""Checks a whole experiment config before anything is built or compiled.

Each failure is a `ConfigError` naming the dotted key to fix. Checks that
need the device count (the mesh) take it as an argument, so the same
function runs in tests without devices.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from longformer_jax.attention.registry import attention_class
from longformer_jax.config_errors import ConfigError, require
from longformer_jax.layers.gating import GATE_TYPES
from longformer_jax.models.block_registry import block_class
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.layer_schedule import layer_config, validate_schedule
from longformer_jax.models.stack_registry import stack_class
from longformer_jax.parallel.mesh import resolve_mesh_shape
from longformer_jax.parallel.remat import remat_policy


def _positive(config, key: str) -> None:
  section, name = key.split('.')
  value = config[section][name]
  require(isinstance(value, (int, np.integer)) and value > 0, key,
          f'must be a positive integer, got {value!r}')


def validate_model(model: ml_collections.ConfigDict) -> None:
  validate_schedule(model)
  for i in range(model.num_layers):
    attention_class(layer_config(model, i).attention)
  block_class(model.get('block', 'pre_ln'))
  stack_class(model.get('stack', 'standard'))
  if model.get('block', 'pre_ln') == 'gtrxl':
    gate = model.get('gtrxl_gate', 'gru')
    require(gate in GATE_TYPES, 'model.gtrxl_gate', f'must be one of {GATE_TYPES}, got {gate!r}')
  if model.get('stack', 'standard') == 'universal_act':
    steps = model.get('act_max_steps', None)
    require(isinstance(steps, int) and steps > 0, 'model.act_max_steps',
            f'must be a positive integer, got {steps!r}')
    epsilon = model.get('act_epsilon', 0.01)
    require(0.0 < epsilon < 1.0, 'model.act_epsilon', f'must be in (0, 1), got {epsilon!r}')
  for name, weight in (model.get('aux_loss_weights', None) or {}).items():
    require(isinstance(weight, (int, float)) and weight >= 0, f'model.aux_loss_weights.{name}',
            f'must be a number >= 0, got {weight!r}')
  compute_dtype(model.dtype)
  remat_policy(model.remat_policy)
  for name in ('num_layers', 'd_model', 'num_heads', 'head_dim', 'd_ff', 'vocab_multiple'):
    value = model[name]
    require(isinstance(value, (int, np.integer)) and value > 0, f'model.{name}',
            f'must be a positive integer, got {value!r}')
  require(model.mem_len >= 0, 'model.mem_len', f'must be >= 0, got {model.mem_len}')
  ff_chunk = model.get('ff_chunk_size', 0)
  require(isinstance(ff_chunk, int) and ff_chunk >= 0, 'model.ff_chunk_size',
          f'must be an integer >= 0 (0: no chunking), got {ff_chunk!r}')
  require(model.head_dim % 2 == 0, 'model.head_dim',
          f'must be even (rotary and sinusoid features come in pairs), got {model.head_dim}')
  require(model.d_model % 2 == 0, 'model.d_model', f'must be even, got {model.d_model}')
  require(0.0 <= model.dropout_rate < 1.0, 'model.dropout_rate',
          f'must be in [0, 1), got {model.dropout_rate}')
  relative_impl = model.get('relative_impl', 'shift')
  require(relative_impl in ('shift', 'gather'), 'model.relative_impl',
          f"must be 'shift' or 'gather', got {relative_impl!r}")
  for i in range(model.num_layers):
    layer = layer_config(model, i)
    # Variants check their own keys when they build their memory (shapes only).
    variant = attention_class(layer.attention)
    jax.eval_shape(lambda: variant.init_state(layer, 1, jnp.float32))


def validate_config(config: ml_collections.ConfigDict, device_count: Optional[int] = None) -> None:
  """Raises `ConfigError` for the first invalid value found."""
  validate_model(config.model)
  for key in ('data.batch_size', 'data.chunk_len', 'data.chunks_per_step',
              'data.eval_batch_size', 'train.num_steps', 'optimizer.grad_accum_steps',
              'train.log_every', 'train.checkpoint_every', 'train.keep_checkpoints'):
    _positive(config, key)
  accum = config.optimizer.grad_accum_steps
  require(config.data.batch_size % accum == 0, 'optimizer.grad_accum_steps',
          f'must divide data.batch_size={config.data.batch_size}, got {accum}')
  require(config.eval.split in ('valid', 'test'), 'eval.split',
          f"must be 'valid' or 'test', got {config.eval.split!r}")
  require(config.eval.chunk_len >= 0, 'eval.chunk_len', f'must be >= 0, got {config.eval.chunk_len}')
  far_distance = config.eval.far_distance
  require(isinstance(far_distance, int) and far_distance >= 0, 'eval.far_distance',
          f'must be an integer >= 0 (0: off), got {far_distance!r}')
  for mem_len in parse_int_list(config.eval.mem_lens, 'eval.mem_lens'):
    require(mem_len >= 0, 'eval.mem_lens', f'must be >= 0, got {mem_len}')
  if device_count is not None:
    validate_mesh(config, device_count)


def validate_mesh(config: ml_collections.ConfigDict, device_count: int) -> None:
  """The mesh fills the devices, and the sharded sizes divide evenly."""
  data, fsdp, tensor = resolve_mesh_shape(config.parallel.mesh_shape, device_count)
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
  if isinstance(text, (int, np.integer)):
    return [int(text)]
  items = [item.strip() for item in str(text).split(',') if item.strip()]
  try:
    return [int(item) for item in items]
  except ValueError:
    raise ConfigError(key, f'must be a comma-separated list of integers, got {text!r}') from None

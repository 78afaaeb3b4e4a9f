"""Tiny configs and synthetic stream batches shared by the model tests."""

import jax
import ml_collections
import numpy as np

from configs.default import get_config
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_class
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.experiment_config import resolve_config
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.model_config import ModelConfig
from longformer_jax.models.resolved_model import ResolvedModel, lm_model_config

VOCAB = 259  # the byte tokenizer's


def tiny_config(**model_overrides) -> ml_collections.ConfigDict:
  """The default experiment config shrunk to a 2-layer, d_model 32 model, resolved.

  `model_overrides` may use the shared model settings, whole sections
  (`longformer={'window': 3}`) or the old flat names (`window=3`), which go
  to the section of the variant that reads them (`config.migration.migrate_flat_model`).
  A variant without a cache gets `mem_len=0` unless `mem_len` is given.
  """
  model = dict(num_layers=2, d_model=32, num_heads=2, head_dim=16, d_ff=64, vocab_multiple=8)
  model.update(get_config()['model'])
  model.update(mem_len=16)
  model.update(model_overrides)
  model, _ = migrate_flat_model(model)
  if 'mem_len' not in model_overrides and not getattr(
      attention_class(model['attention']), 'reads_mem_len', False):
    model['mem_len'] = 0
  values = dict(
      model=model,
      data=dict(batch_size=8, chunk_len=8, chunks_per_step=2, eval_batch_size=8),
      train=dict(num_steps=6, log_every=2, eval_every=0, checkpoint_every=3,
                 async_checkpointing=False))
  return ml_collections.ConfigDict(resolve_config(values))


def tiny_model_config(**model_overrides) -> ResolvedModel:
  return lm_model_config(tiny_config(**model_overrides).model, VOCAB)


def shared_settings(**model_overrides) -> SharedSettings:
  """A layer's `SharedSettings`, built as the models build them (`SharedSettings.of`), from
  `ModelConfig`'s own defaults with `model_overrides` (shared model settings by their
  `config.model` names: `num_heads`, `head_dim`, `d_model`, `causal`, `attention_backend`,
  `num_kv_heads`, ...). Not checked: a layer test may pick any shape."""
  return SharedSettings.of(ModelConfig(**model_overrides))


def stream_batch(batch: int, length: int, seed: int = 0, doc_len: int = 0) -> dict:
  """Random tokens of continuous streams; a new document every `doc_len` tokens."""
  rng = np.random.default_rng(seed)
  positions = np.tile(np.arange(length, dtype=np.int32), (batch, 1))
  if doc_len:
    segment_ids = positions // doc_len
    doc_start = positions % doc_len == 0
  else:
    segment_ids = np.zeros_like(positions)
    doc_start = positions == 0
  return dict(
      inputs=rng.integers(0, 256, (batch, length)).astype(np.int32),
      targets=rng.integers(0, 256, (batch, length)).astype(np.int32),
      positions=positions, segment_ids=segment_ids.astype(np.int32), doc_start=doc_start,
      input_mask=np.ones((batch, length), bool), target_mask=np.ones((batch, length), bool))


def context_of(batch: dict) -> AttentionContext:
  return AttentionContext(positions=batch['positions'], segment_ids=batch['segment_ids'],
                          reset=batch['doc_start'][:, 0], valid=batch['input_mask'])


def random_normal(key: int, shape) -> jax.Array:
  return jax.random.normal(jax.random.PRNGKey(key), shape)

"""Attendre's tiny layer and streams for its float64 references: a one-layer resolved model,
random streams with documents and padding, the jitted layer step and RoPE in numpy."""

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.attention.context import AttentionContext
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.resolved_model import ResolvedModel, resolved_model

B, D, H, HD, C = 2, 16, 2, 8, 8


def numpy_rotate(x, angle_positions):
  """RoPE of `x [..., d]` at `angle_positions [...]` (layers/positional.py's formula)."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (10000.0 ** (np.arange(half) / half))
  angles = np.asarray(angle_positions, np.float64)[..., None] * inv_freq
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                         x2 * np.cos(angles) + x1 * np.sin(angles)], axis=-1)


def model_config(causal=True, **attendre) -> ResolvedModel:
  """A resolved one-layer model; `attendre` are keys of `model.attendre` (memory_size 16)."""
  values = dict(attention='attendre', num_layers=1, num_heads=H, head_dim=HD, d_model=D,
                causal=causal, stack='attendre_delay',
                attendre=dict({'memory_size': 16}, **attendre))
  return resolved_model(resolve_model(values))


def stream(total, doc_len=0, seed=0, num_valid=None):
  """`x [B, total, D]` and its positions, segment ids, valid flags (numpy)."""
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (B, total, D)))
  positions = np.tile(np.arange(total, dtype=np.int32), (B, 1)) + 100
  segments = (positions - 100) // doc_len if doc_len else np.zeros_like(positions)
  valid = np.ones((B, total), bool)
  if num_valid is not None:
    valid[:, num_valid:] = False
  return x, positions, segments.astype(np.int32), valid


def context(positions, segments, valid, reset, predicted=None):
  return AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                          reset=jnp.asarray(reset), valid=jnp.asarray(valid),
                          predicted=None if predicted is None else jnp.asarray(predicted))


_STEPS = {}


def layer_step(config):
  """A jitted `(params, x, state, ctx) -> (y, state)` for `config` (cached per config)."""
  if config not in _STEPS:
    module = attention_layer(config, jnp.float32)
    _STEPS[config] = jax.jit(lambda params, x, state, ctx: module.apply({'params': params}, x,
                                                                          state, ctx)[:2])
  return _STEPS[config]


def init_params(config, seed=1):
  module = attention_layer(config, jnp.float32)
  state = attention_state(config, B)
  x, positions, segments, valid = stream(C)
  ctx = context(positions, segments, valid, np.ones(B, bool))
  return jax.jit(module.init)(jax.random.PRNGKey(seed), jnp.asarray(x), state, ctx)['params']


def padding(after_positions, after_segments, length):
  """`length` padding tokens continuing a stream: zeros, invalid."""
  last_p, last_s = after_positions[:, -1:], after_segments[:, -1:]
  positions = last_p + 1 + np.arange(length, dtype=np.int32)[None]
  return (np.zeros((B, length, D), np.float32), positions, np.repeat(last_s, length, 1),
          np.zeros((B, length), bool))

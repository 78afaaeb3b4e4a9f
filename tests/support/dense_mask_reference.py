"""The dense-mask references the block-sparse variants are held to: the attention layer in
float64 under a mask, a differentiable dense attention, and the chunk inputs (two rows, a
document boundary, padding) of tests/attention/test_sparse_transformer.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.context import AttentionContext

B, D, H, HD = 2, 32, 2, 16
STRIDE, SUMMARY = 4, 2
START = 40     # stream position of the chunk's first token


def numpy_rotate(x, positions):
  """RoPE from Su et al. (2021), eq. 34, pairs (i, i + HD/2); float64."""
  half = x.shape[-1] // 2
  angles = positions[:, :, None, None] * (1.0 / (10000.0 ** (np.arange(half) / half)))
  a, c = x[..., :half], x[..., half:]
  return np.concatenate([a * np.cos(angles) - c * np.sin(angles),
                         c * np.cos(angles) + a * np.sin(angles)], axis=-1)


def numpy_attention(q, k, v, allowed):
  """float64 softmax attention under `allowed [b, h, q, k]`; rows with no key give 0."""
  scores = np.where(allowed, np.einsum('bqhe,bkhe->bhqk', q, k), -np.inf)
  row_max = scores.max(-1, keepdims=True)
  weights = np.exp(scores - np.where(np.isfinite(row_max), row_max, 0.0))
  weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-300)
  return np.einsum('bhqk,bkhe->bqhe', weights, v)


def reference_layer(params, x, positions, allowed):
  """The attention layer in float64: projections, RoPE (relative to the chunk), masked softmax."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  x = np.asarray(x, np.float64)
  rel = positions - positions[:, :1]
  head_dim = p['query']['kernel'].shape[-1]
  q = numpy_rotate(np.einsum('bqd,dhe->bqhe', x, p['query']['kernel']), rel) / np.sqrt(head_dim)
  k = numpy_rotate(np.einsum('bkd,dhe->bkhe', x, p['key']['kernel']), rel)
  v = np.einsum('bkd,dhe->bkhe', x, p['value']['kernel'])
  return np.einsum('bqhe,hed->bqd', numpy_attention(q, k, v, allowed), p['out']['kernel'])


def chunk_facts(n: int, boundary: int = 6):
  """Row 0: one document; row 1: a new document at slot `boundary` and its last 3 slots
  padding. Positions from START, 2 rows (shared by the tests of other variants)."""
  positions = np.tile(np.arange(START, START + n, dtype=np.int32), (B, 1))
  segments = np.zeros((B, n), np.int32)
  segments[1, boundary:] = 1
  valid = np.ones((B, n), bool)
  valid[1, -3:] = False
  return positions, segments, valid


def context_for(positions, segments, valid) -> AttentionContext:
  return AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                          reset=jnp.zeros((B,), bool), valid=jnp.asarray(valid))


def dense_jax_attention(q, k, v, allowed):
  """Differentiable dense reference (float32) under a constant numpy mask."""
  scores = jnp.where(allowed, jnp.einsum('bqhe,bkhe->bhqk', q, k), -1e30)
  weights = jax.nn.softmax(scores, axis=-1) * allowed.any(-1, keepdims=True)
  return jnp.einsum('bhqk,bkhe->bqhe', weights, v)

"""Performer (FAVOR+) references in float64: the paper's features, dense masked linear attention
built one (query, key) pair at a time, RoPE, and the chunk inputs they run on."""

import functools

import jax
import numpy as np

from longformer_jax.attention.performer import attention as performer
from tests.support.fast_compile import FAST_COMPILE

B, H, HD, D = 2, 2, 16, 32
M, BLOCK = 32, 4
START = 40      # stream position of the first token
EPS = performer.RELU_EPS
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE)


def chunk_facts(n: int, start: int = START, boundaries=(9, 6), padding=(0, 3)):
  """positions, segments, valid `[B, n]`: row r starts document 1 at slot boundaries[r]
  (none if >= n) and its last padding[r] slots are padding. Row 0's first key is padding too,
  so query 0 of row 0 has no key at all."""
  positions = np.tile(np.arange(start, start + n, dtype=np.int32), (B, 1))
  segments = np.zeros((B, n), np.int32)
  valid = np.ones((B, n), bool)
  for r in range(B):
    segments[r, boundaries[r]:] = 1
    valid[r, n - padding[r]:] = False
  valid[0, 0] = False
  return positions, segments, valid


def reference_mask(positions, segments, valid, causal=True) -> np.ndarray:
  """`[B, n, n]` bool, one (query, key) pair at a time."""
  b, n = positions.shape
  allowed = np.zeros((b, n, n), bool)
  for r in range(b):
    for i in range(n):
      for j in range(n):
        allowed[r, i, j] = (valid[r, j] and segments[r, i] == segments[r, j]
                            and (not causal or positions[r, j] <= positions[r, i]))
  return allowed


def reference_features(x, w, kernel):
  """phi `[b, n, h, m]` float64, unshifted: the paper's formula."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  m, d = w.shape
  if kernel == 'relu':
    return np.maximum(x @ w.T, 0.0) / np.sqrt(m) + EPS
  x = x * d ** -0.25
  return np.exp(x @ w.T - 0.5 * np.sum(x * x, -1, keepdims=True)) / np.sqrt(m)


def reference_attention(q, k, v, w, allowed, kernel='softmax'):
  """Dense masked linear attention in float64; rows with no key give 0."""
  a = np.einsum('bqhm,bkhm->bhqk', reference_features(q, w, kernel),
                reference_features(k, w, kernel)) * allowed[:, None]
  den = a.sum(-1)
  out = np.einsum('bhqk,bkhe->bqhe', a, np.asarray(v, np.float64))
  return np.where(den.transpose(0, 2, 1)[..., None] > 0,
                  out / np.maximum(den, 1e-300).transpose(0, 2, 1)[..., None], 0.0)


def numpy_rotate(x, positions):
  """RoPE (Su et al., 2021, eq. 34), pairs (i, i + d/2), at absolute positions; float64."""
  half = x.shape[-1] // 2
  angles = positions[:, :, None, None] * (1.0 / (10000.0 ** (np.arange(half) / half)))
  a, c = x[..., :half], x[..., half:]
  return np.concatenate([a * np.cos(angles) - c * np.sin(angles),
                         c * np.cos(angles) + a * np.sin(angles)], axis=-1)

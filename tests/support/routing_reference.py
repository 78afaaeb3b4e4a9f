"""Routing Transformer attention's float64 reference, built one (query, key) pair at a time,
the random chunks it runs on, and the jitted attention held to it."""

import functools

import jax
import numpy as np

from longformer_jax.attention.routing import attention as routing
from tests.support.fast_compile import FAST_COMPILE

B, H, D = 2, 2, 8
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE)


def chunk(n: int, seed: int, num_clusters: int = 3):
  """Random q, k, v `[B, n, H, D]`, clusters `[B, n, H]`; row 1 starts a document at n // 2,
  row 0 ends in two padding slots; positions start at 40."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v = (jax.random.normal(key, (B, n, H, D)) for key in keys[:3])
  clusters = jax.random.randint(keys[3], (B, n, H), 0, num_clusters)
  positions = np.tile(np.arange(40, 40 + n, dtype=np.int32), (B, 1))
  segments = np.zeros((B, n), np.int32)
  segments[1, n // 2:] = 1
  valid = np.ones((B, n), bool)
  valid[0, -2:] = False
  return q, k, v, clusters, positions, segments, valid


def reference_mask(clusters, positions, segments, valid, window: int, causal: bool):
  """`[B, H, n, n]` bool, one pair at a time (tests/attention/test_routing.py's docstring)."""
  clusters = np.asarray(clusters)
  b, n, h = clusters.shape
  mask = np.zeros((b, h, n, n), bool)
  for r in range(b):
    for head in range(h):
      c = clusters[r, :, head]
      same = lambda t, i: valid[r, t] and c[t] == c[i] and segments[r, t] == segments[r, i]  # noqa
      for i in range(n):
        if not valid[r, i]:
          continue
        for j in range(n):
          if j == i or not same(j, i) or (causal and positions[r, j] > positions[r, i]):
            continue
          between = range(j + 1, i + 1) if j < i else range(i, j)
          if sum(1 for t in between if same(t, i)) <= window:
            mask[r, head, i, j] = True
        if not mask[r, head, i].any():
          mask[r, head, i, i] = True            # no other key: the query itself
  return mask


def reference_attention(q, k, v, mask):
  """Dense masked softmax attention in float64 `[B, n, H, D]`; rows with no key give 0."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.where(mask, np.einsum('bqhd,bkhd->bhqk', q, k), -np.inf)
  top = np.max(logits, axis=-1, keepdims=True)
  weights = np.where(mask, np.exp(logits - np.where(np.isfinite(top), top, 0.0)), 0.0)
  weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-300)
  return np.einsum('bhqk,bkhd->bqhd', weights, v)


@functools.partial(jit, static_argnames=('window', 'causal'))
def fast(q, k, v, clusters, positions, segments, valid, window, causal):
  return routing.routing_attention(q, k, v, clusters, positions, segments, valid,
                                   window=window, causal=causal)

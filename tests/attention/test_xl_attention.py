"""Transformer-XL attention against an independent dense reference.

The reference builds [memory; chunk], computes every score with an explicit
relative-position lookup R[i - j] (no shift trick), masks by positions and
takes a plain softmax, all in float64 numpy.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.xl import XLAttention, XLConfig
from longformer_jax.layers.positional import relative_shift
from longformer_jax.memory import fifo
from tests.support.position_references import numpy_sinusoid
from tests.support.tiny_models import shared_settings

B, C, M, D, H, HD = 2, 6, 5, 16, 2, 8


def reference_xl(params, x, mem_values, mem_pos, mem_valid, q_pos, clamp_len):
  """Dense XL attention, loop over (query, key) pairs; float64."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  cat = np.concatenate([mem_values, x], axis=1)                       # [b, k, d]
  k_pos = np.concatenate([mem_pos, q_pos], axis=1)
  k_valid = np.concatenate([mem_valid, np.ones(q_pos.shape, bool)], axis=1)
  q = np.einsum('bqd,dhe->bqhe', x, p['query']['kernel'])
  k = np.einsum('bkd,dhe->bkhe', cat, p['key']['kernel'])
  v = np.einsum('bkd,dhe->bkhe', cat, p['value']['kernel'])
  u, vb = p['content_bias'], p['position_bias']
  out = np.zeros(q.shape)
  for b in range(x.shape[0]):
    for i in range(x.shape[1]):
      for h in range(H):
        scores, keys = [], []
        for j in range(cat.shape[1]):
          distance = q_pos[b, i] - k_pos[b, j]
          if not k_valid[b, j] or distance < 0:
            continue
          if clamp_len > 0:
            distance = min(distance, clamp_len)
          r = numpy_sinusoid(distance, D) @ p['relative_key']['kernel'][:, h]   # W_kR R_{i-j}
          scores.append(((q[b, i, h] + u[h]) @ k[b, j, h] + (q[b, i, h] + vb[h]) @ r) / np.sqrt(HD))
          keys.append(j)
        w = np.exp(np.array(scores) - max(scores))
        w /= w.sum()
        out[b, i, h] = sum(wj * v[b, j, h] for wj, j in zip(w, keys))
  return np.einsum('bqhe,hed->bqd', out, p['out']['kernel'])


def run_module(relative_impl, clamp_len, reset=False):
  module = XLAttention(config=XLConfig(clamp_len=clamp_len, relative_impl=relative_impl),
                       shared=shared_settings(num_heads=H, head_dim=HD, d_model=D))
  x = jax.random.normal(jax.random.PRNGKey(1), (B, C, D))
  start = 20
  q_pos = np.tile(np.arange(start, start + C, dtype=np.int32), (B, 1))
  mem = fifo.create(B, M, (D,))
  mem = mem.replace(values=jax.random.normal(jax.random.PRNGKey(2), (B, M, D)),
                    positions=jnp.tile(jnp.arange(start - M, start, dtype=jnp.int32), (B, 1)),
                    valid=jnp.array([[True] * M, [False, False, True, True, True]]))
  ctx = AttentionContext(positions=jnp.asarray(q_pos), segment_ids=jnp.zeros((B, C), jnp.int32),
                         reset=jnp.array([reset, False]), valid=jnp.ones((B, C), bool))
  params = module.init(jax.random.PRNGKey(0), x, mem, ctx)['params']
  # Non-zero u, v so that every term of the score is exercised.
  params = dict(params, content_bias=jax.random.normal(jax.random.PRNGKey(3), (H, HD)),
                position_bias=jax.random.normal(jax.random.PRNGKey(4), (H, HD)))
  y, new_mem, aux = module.apply({'params': params}, x, mem, ctx)
  return params, x, mem, q_pos, y, new_mem


@pytest.mark.parametrize('relative_impl', ['shift', 'gather'])
@pytest.mark.parametrize('clamp_len', [-1, 3])
def test_xl_attention_matches_dense_reference(relative_impl, clamp_len):
  params, x, mem, q_pos, y, _ = run_module(relative_impl, clamp_len)
  expected = reference_xl(params, np.asarray(x, np.float64), np.asarray(mem.values, np.float64),
                          np.asarray(mem.positions), np.asarray(mem.valid), q_pos, clamp_len)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_reset_row_ignores_its_memory():
  params, x, mem, q_pos, y, _ = run_module('shift', -1, reset=True)
  no_memory = np.zeros_like(np.asarray(mem.valid))
  no_memory[1] = np.asarray(mem.valid)[1]
  expected = reference_xl(params, np.asarray(x, np.float64), np.asarray(mem.values, np.float64),
                          np.asarray(mem.positions), no_memory, q_pos, -1)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_memory_update_keeps_last_mem_len_inputs():
  _, x, mem, q_pos, _, new_mem = run_module('shift', -1)
  np.testing.assert_array_equal(np.asarray(new_mem.values), np.asarray(x)[:, C - M:])
  np.testing.assert_array_equal(np.asarray(new_mem.positions), q_pos[:, C - M:])
  assert np.asarray(new_mem.valid).all()


@pytest.mark.parametrize('q,k', [(4, 4), (3, 7), (5, 9)])
def test_relative_shift_equals_gather(q, k):
  raw = np.random.default_rng(0).normal(size=(2, 3, q, k)).astype(np.float32)
  shifted = np.asarray(relative_shift(jnp.asarray(raw)))
  m = k - q
  for i in range(q):
    for j in range(m + i + 1):          # keys at distance >= 0
      distance = m + i - j
      column = k - 1 - distance           # where R_distance sits in raw
      np.testing.assert_array_equal(shifted[:, :, i, j], raw[:, :, i, column])

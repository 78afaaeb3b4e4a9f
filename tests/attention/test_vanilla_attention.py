"""Vanilla attention (RoPE, optional cache) against a numpy reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.vanilla.attention import VanillaAttention
from longformer_jax.memory import fifo
from tests.support.position_references import numpy_rotate
from tests.support.tiny_models import shared_settings

B, C, M, D, H, HD = 2, 5, 4, 16, 2, 8


def reference(params, x, mem, q_pos, causal):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  cat = np.concatenate([np.asarray(mem.values, np.float64), x], axis=1)
  k_pos = np.concatenate([np.asarray(mem.positions), q_pos], axis=1)
  k_valid = np.concatenate([np.asarray(mem.valid), np.ones(q_pos.shape, bool)], axis=1)
  q = numpy_rotate(np.einsum('bqd,dhe->bqhe', x, p['query']['kernel']), q_pos)
  k = numpy_rotate(np.einsum('bkd,dhe->bkhe', cat, p['key']['kernel']), k_pos)
  v = np.einsum('bkd,dhe->bkhe', cat, p['value']['kernel'])
  scores = np.einsum('bqhe,bkhe->bhqk', q, k) / np.sqrt(HD)
  allowed = k_valid[:, None, None, :] & (
      (not causal) | (k_pos[:, None, None, :] <= q_pos[:, None, :, None]))
  scores = np.where(allowed, scores, -np.inf)
  w = np.exp(scores - scores.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhe,hed->bqd', w, v, p['out']['kernel'])


def setup(causal, start):
  module = VanillaAttention(shared=shared_settings(num_heads=H, head_dim=HD, d_model=D,
                                                   causal=causal))
  x = jax.random.normal(jax.random.PRNGKey(1), (B, C, D))
  q_pos = np.tile(np.arange(start, start + C, dtype=np.int32), (B, 1))
  mem = fifo.create(B, M, (D,)).replace(
      values=jax.random.normal(jax.random.PRNGKey(2), (B, M, D)),
      positions=jnp.tile(jnp.arange(start - M, start, dtype=jnp.int32), (B, 1)),
      valid=jnp.array([[True] * M, [False, True, True, True]]))
  ctx = AttentionContext(positions=jnp.asarray(q_pos), segment_ids=jnp.zeros((B, C), jnp.int32),
                         reset=jnp.zeros((B,), bool), valid=jnp.ones((B, C), bool))
  params = module.init(jax.random.PRNGKey(0), x, mem, ctx)['params']
  return module, params, x, mem, ctx, q_pos


@pytest.mark.parametrize('causal', [True, False])
def test_vanilla_matches_numpy_reference(causal):
  module, params, x, mem, ctx, q_pos = setup(causal, start=7)
  y, _, _ = module.apply({'params': params}, x, mem, ctx)
  expected = reference(params, np.asarray(x, np.float64), mem, q_pos, causal)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_outputs_depend_on_relative_positions_only():
  """A stream 10^6 tokens in gives the same outputs as one at the start."""
  module, params, x, mem, ctx, _ = setup(True, start=7)
  far = 1_000_000
  shifted_mem = mem.replace(positions=mem.positions + far)
  shifted_ctx = ctx.replace(positions=ctx.positions + far)
  near, _, _ = module.apply({'params': params}, x, mem, ctx)
  shifted, _, _ = module.apply({'params': params}, x, shifted_mem, shifted_ctx)
  np.testing.assert_allclose(np.asarray(shifted), np.asarray(near), rtol=1e-5, atol=1e-6)

"""A layer on a kernel backend against the same layer on the XLA path: one chunk with documents
and padding, the outputs and parameter gradients of both, compared leaf by leaf."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.context import AttentionContext
from longformer_jax.memory import fifo
from longformer_jax.models.model_config import resolve_model

B, H, HD, D = 2, 2, 16, 32
START = 1000


def chunk_context(chunk: int) -> AttentionContext:
  """Row 0: a document, then from 3/4 on padding with a document id of its own
  (its queries see no key in any pattern). Row 1: documents starting at
  chunk // 3 and 2 * chunk // 3, the first three tokens of the second invalid
  (causal queries among them see no key)."""
  positions = np.tile(np.arange(START, START + chunk, dtype=np.int32), (B, 1))
  segments = np.zeros((B, chunk), np.int32) + 7
  segments[1] = 2 + (np.arange(chunk) >= chunk // 3) + (np.arange(chunk) >= 2 * chunk // 3)
  valid = np.ones((B, chunk), bool)
  valid[0, 3 * chunk // 4:] = False
  segments[0, 3 * chunk // 4:] = 8
  valid[1, chunk // 3:chunk // 3 + 3] = False
  return AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                          reset=jnp.zeros((B,), bool), valid=jnp.asarray(valid))


def layer_outputs_and_grads(module_for, chunk=40, kernel='splash'):
  """The layer with `kernel` and with 'xla' (same params): output and parameter gradients."""
  ctx = chunk_context(chunk)
  x = jax.random.normal(jax.random.PRNGKey(3), (B, chunk, D))
  probe = jax.random.normal(jax.random.PRNGKey(4), (B, chunk, D))
  state = fifo.create(B, 0, (D,))
  params = module_for('xla').init(jax.random.PRNGKey(0), x, state, ctx)['params']

  @jax.jit
  def run(params):
    results = {}
    for backend in (kernel, 'xla'):
      module = module_for(backend)
      out, pullback = jax.vjp(lambda p, x: module.apply({'params': p}, x, state, ctx)[0],
                              params, x)
      results[backend] = (out, pullback(probe))
    return results
  return run(params)


def assert_trees_close(got, want, atol):
  for a, b in zip(jax.tree_util.tree_leaves(nn.meta.unbox(got)),
                  jax.tree_util.tree_leaves(nn.meta.unbox(want))):
    np.testing.assert_allclose(a, b, atol=atol, rtol=1e-4)


def resolve(**model):
  return resolve_model(dict(num_layers=1, d_model=D, num_heads=H, head_dim=HD, d_ff=64, **model))

"""Transformer-XL attention with the chunk split over the `sequence` axis
(attention/sequence_parallel/relative_attention.py) equals the unsplit layer.

(1) The XL layer (memory of 8, chunks of 16) on data 2 x sequence 4 equals the
unsplit layer with the same `relative_impl`: outputs and gradients with
respect to every parameter and the input, to 1e-5 relative, on rows with
padding, documents starting mid-chunk, a reset (empty) memory and a partly
invalid one; ring and all-gather, `clamp_len` off and on.

(2) Two train steps of a tiny XL decoder (two chunks each, the memory carried)
on data 2 x sequence 4 give the loss, gradient norm, parameters and memory of
the single-device steps (the driver of tests/support/sharded_cache_steps.py
with the attention switched to `xl`); the compiled step holds the ring's
collective-permute.
"""

import functools
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.xl import XLAttention, XLConfig
from longformer_jax.memory import fifo
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.parallel.parallel_config import ParallelConfig
from tests.support import sharded_cache_steps as vanilla_steps
from tests.support.sequence_parallel_comparison import DATA_2_SEQUENCE_4, assert_close
from tests.support.tiny_models import shared_settings, tiny_config

BATCH, CHUNK, MEM, D_MODEL, HEADS, HEAD_DIM = 4, 16, 8, 32, 4, 8
pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (fake) devices')


# ---- (1) the layer -------------------------------------------------------------------------

def _layer_case(relative_impl: str, clamp_len: int, seed: int = 0):
  """Module, parameters (u, v non-zero), input `[4, 16, 32]`, memory, context, cotangent.

  Continuous streams (memory slot j at position p0 - 8 + j), so 'shift' and
  'gather' agree. Row 0: one document continuing from a full memory; row 1:
  reset (memory cleared), padding at the chunk's start, a document from token
  5; row 2: the memory's first 3 entries invalid, documents from tokens 6 and
  11, padding at the end; row 3: a new document at the last token.
  """
  module = XLAttention(config=XLConfig(clamp_len=clamp_len, relative_impl=relative_impl),
                       shared=shared_settings(num_heads=HEADS, head_dim=HEAD_DIM, d_model=D_MODEL))
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  start = 100 + 37 * np.arange(BATCH)[:, None]
  token = np.arange(CHUNK)[None]
  starts = [[99], [5, 99], [6, 11], [15, 99]]
  segments = np.stack([sum((token[0] >= s).astype(np.int32) for s in row) for row in starts])
  valid = np.ones((BATCH, CHUNK), bool)
  valid[1, :3] = False
  valid[2, -4:] = False
  mem_valid = np.ones((BATCH, MEM), bool)
  mem_valid[2, :3] = False
  memory = fifo.create(BATCH, MEM, (D_MODEL,)).replace(
      values=normal(BATCH, MEM, D_MODEL),
      positions=jnp.asarray(start - MEM + np.arange(MEM)[None], jnp.int32),
      segment_ids=jnp.zeros((BATCH, MEM), jnp.int32), valid=jnp.asarray(mem_valid))
  ctx = AttentionContext(positions=jnp.asarray(start + token, jnp.int32),
                         segment_ids=jnp.asarray(segments), valid=jnp.asarray(valid),
                         reset=jnp.asarray([False, True, False, False]))
  x = normal(BATCH, CHUNK, D_MODEL)
  params = nn.meta.unbox(jax.jit(module.init)(jax.random.PRNGKey(seed), x, memory, ctx)['params'])
  params = dict(params, content_bias=normal(HEADS, HEAD_DIM), position_bias=normal(HEADS, HEAD_DIM))
  return module, params, x, memory, ctx, normal(BATCH, CHUNK, D_MODEL)


def _layer_vjp(module, params, x, memory, ctx, cotangent):
  def apply(params, x):
    y, _, _ = module.apply({'params': params}, x, memory, ctx)
    return y
  out, pullback = jax.vjp(apply, params, x)
  return out, pullback(cotangent)


# Default suite: the ring with load balancing and the shift layout; `-m slow`: gather,
# clamp_len, all-gather, no load balancing.
LAYER_CASES = [('ring', True, 'shift', -1)] + [
    pytest.param(*case, marks=pytest.mark.slow) for case in
    [('ring', True, 'gather', 5), ('all_gather', True, 'shift', -1),
     ('all_gather', True, 'gather', -1), ('ring', False, 'shift', 5)]]


@pytest.mark.parametrize('method,balanced,relative_impl,clamp_len', LAYER_CASES)
def test_xl_layer_split_matches_unsplit_layer(method, balanced, relative_impl, clamp_len):
  module, params, x, memory, ctx, cotangent = _layer_case(relative_impl, clamp_len)
  run = functools.partial(_layer_vjp, module)
  expected_out, expected_grads = jax.jit(run)(params, x, memory, ctx, cotangent)
  mesh = make_mesh(DATA_2_SEQUENCE_4, jax.devices()[:8])
  parallel = ParallelConfig(sequence_parallel=method, load_balance=balanced)
  with sharding.activation_sharding(mesh, parallel.logical_axis_rules, parallel):
    split = jax.jit(functools.partial(_layer_vjp, module))
    text = split.lower(params, x, memory, ctx, cotangent).as_text()
    out, grads = split(params, x, memory, ctx, cotangent)
  # The split path ran: the ring's hops, or the gathered keys.
  assert ('collective_permute' if method == 'ring' else 'all_gather') in text
  assert_close(out, expected_out)
  assert np.all(np.asarray(out)[1, :3] == 0)    # padding, empty memory: no visible key
  flat, expected_flat = (jax.tree_util.tree_leaves_with_path(g) for g in (grads, expected_grads))
  assert len(flat) == len(expected_flat) == 8   # 7 parameters and the input
  for (path, grad), (_, expected) in zip(flat, expected_flat):
    assert np.max(np.abs(np.asarray(expected))) > 0, jax.tree_util.keystr(path)
    assert_close(grad, expected)


# ---- (2) train steps -----------------------------------------------------------------------

def xl_two_steps(mesh_shape, method='ring', hlo=None):
  """`test_sharded_train_step_memory.two_steps` with a tiny XL decoder (memory of 8)."""
  made = []

  def xl_config(**overrides):
    config = tiny_config(**dict(overrides, attention='xl'))
    made.append(config)
    return config
  with mock.patch.object(vanilla_steps, 'tiny_config', xl_config):
    result = vanilla_steps.two_steps(mesh_shape, method=method, hlo=hlo)
  assert made[0].model.attention == 'xl' and made[0].model.mem_len == vanilla_steps.MEM_LEN
  return result


@pytest.fixture(scope='module')
def xl_single_device():
  return xl_two_steps((1, 1, 1))


@pytest.mark.parametrize('method', ['ring', pytest.param('all_gather', marks=pytest.mark.slow)])
def test_sequence_sharded_xl_step_matches_single_device(xl_single_device, method):
  """data 2 x sequence 4, zigzag: loss, gradient norm, parameters and the carried memory
  equal the single-device steps; the compiled step exchanges keys."""
  hlo = []
  state, metrics = xl_two_steps((2, 1, 1, 4), method=method, hlo=hlo)
  vanilla_steps.assert_steps_match(state, metrics, xl_single_device, method, hlo)

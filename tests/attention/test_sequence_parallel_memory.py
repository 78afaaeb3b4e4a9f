"""Sequence parallelism with a cache and with Longformer's global tokens.

(1) `sequence_parallel_attention(memory=...)`: keys `[memory; chunk]`, the
memory replicated along the `sequence` axis and the chunk split (ring or
all-gather, zigzag load balancing). Outputs and gradients (w.r.t. q, k, v and
the memory's k, v) equal the single-device dense masked softmax over
`[memory; chunk]`, on rows with padding, documents starting mid-chunk and an
empty (invalid) memory.

(2) The Longformer layer with global tokens (and padding, a document starting
mid-chunk, more flagged tokens than global slots) run on a mesh with a
sequence axis (window halos, gathered global keys, global rows merged across
devices) equals the unsplit layer: outputs and gradients w.r.t. the
parameters and the input.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
from longformer_jax.memory import fifo
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.parallel.parallel_config import ParallelConfig
from longformer_jax.attention.sequence_parallel.attention import sequence_parallel_attention
from tests.support.sequence_parallel_comparison import DATA_2_SEQUENCE_4, assert_close
from tests.support.tiny_models import shared_settings

BATCH, CHUNK, MEM, HEADS, HEAD_DIM = 4, 32, 8, 2, 8
SEQUENCE_8 = (1, 1, 1, 8)


# ---- (1) [memory; chunk] ------------------------------------------------------------------

@pytest.fixture(scope='module')
def inputs():
  """Chunk arrays `[4, 32, ...]`, memory arrays `[4, 8, ...]`, a cotangent.

  Row 0: one document continuing from a full memory; row 1: an empty (all
  invalid) memory, padding at the chunk's start, a document from token 5;
  row 2: the memory's first 3 entries invalid, documents from tokens 13 and
  20 (only the first sees the memory), padding at the end; row 3: the memory
  in the chunk's document, a new document at the last token.
  """
  rng = np.random.RandomState(0)
  normal = lambda *shape: jnp.asarray(rng.randn(*shape), jnp.float32)
  q, k, v, cotangent = (normal(BATCH, CHUNK, HEADS, HEAD_DIM) for _ in range(4))
  k_mem, v_mem = (normal(BATCH, MEM, HEADS, HEAD_DIM) for _ in range(2))
  start = 100 + 37 * np.arange(BATCH)[:, None]
  positions = start + np.arange(CHUNK)[None]
  mem_positions = start - MEM + np.arange(MEM)[None]
  token = np.arange(CHUNK)[None]
  starts = [[99], [5, 99], [13, 20], [31, 99]]
  segments = np.stack([sum((token[0] >= s).astype(np.int32) for s in row) for row in starts])
  valid = np.ones((BATCH, CHUNK), bool)
  valid[1, :3] = False
  valid[2, -5:] = False
  mem_valid = np.ones((BATCH, MEM), bool)
  mem_valid[1] = False
  mem_valid[2, :3] = False
  as_int = lambda a: jnp.asarray(a, jnp.int32)
  return dict(q=q, k=k, v=v, k_mem=k_mem, v_mem=v_mem, cotangent=cotangent,
              positions=as_int(positions), segment_ids=as_int(segments),
              valid=jnp.asarray(valid), mem_positions=as_int(mem_positions),
              mem_segments=as_int(np.zeros((BATCH, MEM))), mem_valid=jnp.asarray(mem_valid))


ARGS = ('q', 'k', 'v', 'k_mem', 'v_mem', 'cotangent', 'positions', 'segment_ids', 'valid',
        'mem_positions', 'mem_segments', 'mem_valid')


def _vjp(attention, q, k, v, k_mem, v_mem, cotangent):
  out, pullback = jax.vjp(attention, q, k, v, k_mem, v_mem)
  return out, pullback(cotangent)


@functools.lru_cache(maxsize=None)
def _reference_fn(causal):
  """Single-device dense masked softmax over the concatenated `[memory; chunk]` keys."""
  def run(q, k, v, k_mem, v_mem, cotangent, positions, segment_ids, valid, mem_positions,
          mem_segments, mem_valid):
    def attention(q, k, v, k_mem, v_mem):
      keys = jnp.concatenate([k_mem, k], axis=1)
      mask = causal_document_mask(positions, segment_ids,
                                  jnp.concatenate([mem_positions, positions], axis=1),
                                  jnp.concatenate([mem_segments, segment_ids], axis=1),
                                  jnp.concatenate([mem_valid, valid], axis=1), causal=causal)
      logits = jnp.einsum('bqhd,bkhd->bhqk', q, keys) / np.sqrt(HEAD_DIM)
      return attend(logits, mask, jnp.concatenate([v_mem, v], axis=1))
    return _vjp(attention, q, k, v, k_mem, v_mem, cotangent)
  return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _sequence_parallel_fn(mesh_shape, method, causal, balanced):
  mesh = make_mesh(mesh_shape, jax.devices()[:8])

  def run(q, k, v, k_mem, v_mem, cotangent, positions, segment_ids, valid, mem_positions,
          mem_segments, mem_valid):
    def attention(q, k, v, k_mem, v_mem):
      memory = (k_mem, v_mem, mem_positions, mem_segments, mem_valid)
      return sequence_parallel_attention(q, k, v, positions, segment_ids, valid, mesh=mesh,
                                         causal=causal, method=method, load_balance=balanced,
                                         memory=memory)
    return _vjp(attention, q, k, v, k_mem, v_mem, cotangent)
  return jax.jit(run)


# Default suite: causal, balanced, both methods on data 2 x sequence 4, all-gather on
# sequence 8; `-m slow`: the ring on sequence 8, unbalanced and bidirectional cases.
CASES = [(DATA_2_SEQUENCE_4, 'ring', True, True), (DATA_2_SEQUENCE_4, 'all_gather', True, True),
         (SEQUENCE_8, 'all_gather', True, True)]
CASES += [pytest.param(*case, marks=pytest.mark.slow) for case in
          [(SEQUENCE_8, 'ring', True, True)] +
          [(DATA_2_SEQUENCE_4, method, causal, False) for method in ('ring', 'all_gather')
           for causal in (True, False)]]


@pytest.mark.parametrize('mesh_shape,method,causal,balanced', CASES)
def test_memory_attention_matches_dense_reference(inputs, mesh_shape, method, causal, balanced):
  args = tuple(inputs[name] for name in ARGS)
  expected_out, expected_grads = _reference_fn(causal)(*args)
  out, grads = _sequence_parallel_fn(mesh_shape, method, causal, balanced)(*args)
  assert_close(out, expected_out)
  for name, grad, expected in zip(('q', 'k', 'v', 'k_mem', 'v_mem'), grads, expected_grads):
    assert np.max(np.abs(np.asarray(expected))) > 0, name
    assert_close(grad, expected)
  out = np.asarray(out)
  if causal:   # row 1: empty memory, first queries see only padding -> zeros, not NaN
    assert np.all(out[1, 0] == 0)


# ---- (2) Longformer global tokens ---------------------------------------------------------

LF_BATCH, LF_CHUNK, LF_D = 4, 32, 16


def _longformer_case(causal, global_projections, seed=0):
  """Module, parameters, input and context: 3 global slots, padding, a document from
  token 18 of rows 1 and 3, more flagged tokens than slots in row 0, none in row 2."""
  module = LongformerAttention(
      config=LongformerConfig(window=4, head_dilations='1,1', block_size=4, global_tokens=3,
                              global_projections=global_projections, window_cache=False),
      shared=shared_settings(num_heads=HEADS, head_dim=HEAD_DIM, d_model=LF_D, causal=causal))
  rng = np.random.default_rng(seed)
  positions = np.tile(np.arange(50, 50 + LF_CHUNK, dtype=np.int32), (LF_BATCH, 1))
  segments = np.zeros((LF_BATCH, LF_CHUNK), np.int32)
  segments[1::2, 18:] = 1
  valid = np.ones((LF_BATCH, LF_CHUNK), bool)
  valid[0, -5:] = False
  valid[1, 2] = False
  valid[3, :4] = False
  flags = np.zeros((LF_BATCH, LF_CHUNK), bool)
  flags[0, [0, 9, 15, 26, 29]] = True        # 4 valid flagged tokens, 1 flagged padding
  flags[1, [2, 7, 20]] = True                # the first flagged token is padding
  flags[3, [5, 31]] = True                   # global tokens on the first and last devices
  ctx = AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                         reset=jnp.zeros((LF_BATCH,), bool), valid=jnp.asarray(valid),
                         global_flags=jnp.asarray(flags))
  x = jnp.asarray(rng.normal(size=(LF_BATCH, LF_CHUNK, LF_D)), jnp.float32)
  state = fifo.create(LF_BATCH, 0, (LF_D,))
  params = nn.meta.unbox(jax.jit(module.init)(jax.random.PRNGKey(seed), x, state, ctx)['params'])
  for name in ('query_global', 'key_global', 'value_global'):   # differ from the local ones
    if name in params:
      params[name] = {'kernel': params[name]['kernel'] * 1.5 + 0.1}
  cotangent = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  return module, params, x, state, ctx, cotangent


def _longformer_vjp(module, params, x, state, ctx, cotangent):
  def apply(params, x):
    y, _, _ = module.apply({'params': params}, x, state, ctx)
    return y
  out, pullback = jax.vjp(apply, params, x)
  return out, pullback(cotangent)


@pytest.mark.parametrize('causal,global_projections', [
    (False, True), pytest.param(False, False, marks=pytest.mark.slow),
    pytest.param(True, True, marks=pytest.mark.slow)])
def test_longformer_global_tokens_match_unsplit_layer(causal, global_projections):
  module, params, x, state, ctx, cotangent = _longformer_case(causal, global_projections)
  run = functools.partial(_longformer_vjp, module)
  expected_out, expected_grads = jax.jit(run)(params, x, state, ctx, cotangent)
  mesh = make_mesh(DATA_2_SEQUENCE_4, jax.devices()[:8])
  with sharding.activation_sharding(mesh, ParallelConfig().logical_axis_rules):
    split = jax.jit(functools.partial(_longformer_vjp, module))
    text = split.lower(params, x, state, ctx, cotangent).as_text()
    out, grads = split(params, x, state, ctx, cotangent)
  # The split path ran: halo permutes, and the global rows' parts gathered.
  assert 'collective_permute' in text and 'all_gather' in text
  assert_close(out, expected_out)
  flat, expected_flat = (jax.tree_util.tree_leaves_with_path(g) for g in (grads, expected_grads))
  for (path, grad), (_, expected) in zip(flat, expected_flat):
    assert np.max(np.abs(np.asarray(expected))) > 0, jax.tree_util.keystr(path)
    assert_close(grad, expected)

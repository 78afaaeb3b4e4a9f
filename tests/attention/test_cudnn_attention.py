"""cuDNN flash attention (`model.attention_backend='cudnn'`) against the XLA path, on a GPU.

Skipped without a GPU (the default suite runs on CPU; tests/conftest.py sets
JAX_PLATFORMS=cpu unless it is already set, so run these with
`JAX_PLATFORMS=cuda python -m pytest -q tests/attention/test_cudnn_attention.py`).

- the wrapper `cudnn_attention` (implementation 'cudnn') equals the dense
  float32 masked softmax of `dot_product.py` on the same bfloat16-rounded
  inputs: outputs and gradients w.r.t. q, k, v, causal and the causal
  sliding window, with documents starting inside the chunk, padding and
  queries that have no key (0);
- the vanilla layer with `attention_backend='cudnn'` equals `'xla'` (same
  parameters, bfloat16): outputs and parameter gradients, without and with
  a cache (`mem_len > 0`);
- cuDNN's causal sliding window over packed documents
  (`cudnn_window.window_attention`) equals the same description run by XLA:
  outputs, log-sum-exp and gradients through both, for one document per row,
  padding, and documents mid-row after an empty-cache prefix;
- the causal Longformer layer (window cache, global tokens) and StreamingLLM's
  layer without sinks (imported Mistral / Qwen2 windows) with 'cudnn' equal
  'xla' in bfloat16 over two chunks.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.vanilla.cudnn_attention import cudnn_attention
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.vanilla.attention import VanillaAttention
from longformer_jax.memory import fifo
from tests.support.tiny_models import shared_settings

pytestmark = pytest.mark.skipif(jax.default_backend() != 'gpu',
                                reason='cuDNN attention needs a GPU')

B, H, HD, D = 2, 4, 64, 128
CHUNKS = (64, 40)            # a multiple of cuDNN's tiles and not
TOLERANCE = dict(atol=2e-2, rtol=2e-2)   # bfloat16 outputs


def chunk_context(chunk: int, start: int = 1000) -> AttentionContext:
  """Row 0: a document, then padding with its own document id (no key for
  its queries). Row 1: documents starting inside the chunk, the first three
  tokens of the second one invalid."""
  positions = np.tile(np.arange(start, start + chunk, dtype=np.int32), (B, 1))
  segments = np.zeros((B, chunk), np.int32) + 7
  segments[0, 3 * chunk // 4:] = 8
  segments[1] = 2 + (np.arange(chunk) >= chunk // 3) + (np.arange(chunk) >= 2 * chunk // 3)
  valid = np.ones((B, chunk), bool)
  valid[0, 3 * chunk // 4:] = False
  valid[1, chunk // 3:chunk // 3 + 3] = False
  return AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                          reset=jnp.zeros((B,), bool), valid=jnp.asarray(valid))


def window_mask(ctx: AttentionContext, window) -> jax.Array:
  """Causal document mask from positions, and keys at most `window` back."""
  p = ctx.positions
  mask = causal_document_mask(p, ctx.segment_ids, p, ctx.segment_ids, ctx.valid, causal=True)
  if window is not None:
    mask &= p[:, None, :] >= p[:, :, None] - window
  return mask


@pytest.mark.parametrize('chunk', CHUNKS)
@pytest.mark.parametrize('window', [None, 5])
def test_cudnn_wrapper_equals_dense_reference(chunk, window):
  ctx = chunk_context(chunk)
  mask = window_mask(ctx, window)
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v = (jax.random.normal(key, (B, chunk, H, HD)).astype(jnp.bfloat16) for key in keys[:3])
  probe = jax.random.normal(keys[3], (B, chunk, H, HD))

  def fast(q, k, v):
    return cudnn_attention(q, k, v, mask, scale=HD ** -0.5, causal=True, window=window)

  def dense(q, k, v):
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    return attend(jnp.einsum('bqhd,bkhd->bhqk', q * HD ** -0.5, k), mask, v)

  def run(fn):
    out, pullback = jax.vjp(lambda *a: fn(*a).astype(jnp.float32), q, k, v)
    return out, pullback(probe)

  (out, grads), (expected, expected_grads) = jax.jit(lambda: (run(fast), run(dense)))()
  np.testing.assert_allclose(out, expected, **TOLERANCE)
  for got, want, what in zip(grads, expected_grads, 'qkv'):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=5e-2, rtol=5e-2, err_msg=f'd{what}')
  empty = ~np.asarray(mask).any(-1)
  assert empty.any()
  np.testing.assert_array_equal(np.asarray(out)[empty], 0.0)


@pytest.mark.parametrize('mem_len', [0, 32])
def test_vanilla_layer_cudnn_equals_xla(mem_len):
  chunk = 64
  ctx = chunk_context(chunk)
  x = jax.random.normal(jax.random.PRNGKey(3), (B, chunk, D))
  probe = jax.random.normal(jax.random.PRNGKey(4), (B, chunk, D))
  state = fifo.create(B, mem_len, (D,))
  if mem_len:       # a cache of the previous tokens of the row, the oldest few invalid
    state = state.replace(
        values=jax.random.normal(jax.random.PRNGKey(5), (B, mem_len, D)),
        positions=jnp.tile(jnp.arange(1000 - mem_len, 1000, dtype=jnp.int32), (B, 1)),
        segment_ids=jnp.full((B, mem_len), 7, jnp.int32).at[1].set(2),
        valid=jnp.tile(jnp.arange(mem_len) >= 4, (B, 1)))
  make = lambda backend: VanillaAttention(
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=True,
                             attention_backend=backend), dtype=jnp.bfloat16)
  params = make('xla').init(jax.random.PRNGKey(0), x, state, ctx)['params']

  @jax.jit
  def run(params):
    results = {}
    for backend in ('cudnn', 'xla'):
      module = make(backend)
      out, pullback = jax.vjp(
          lambda p: module.apply({'params': p}, x, state, ctx)[0].astype(jnp.float32), params)
      results[backend] = (out, pullback(probe))
    return results

  results = run(params)
  np.testing.assert_allclose(results['cudnn'][0], results['xla'][0], **TOLERANCE)
  for got, want in zip(jax.tree_util.tree_leaves(nn.meta.unbox(results['cudnn'][1])),
                       jax.tree_util.tree_leaves(nn.meta.unbox(results['xla'][1]))):
    scale = float(jnp.max(jnp.abs(want.astype(jnp.float32)))) + 1e-6
    np.testing.assert_allclose(np.asarray(got, np.float32) / scale,
                               np.asarray(want, np.float32) / scale, atol=3e-2)


# ---- the causal sliding window with packed documents (attention/core/cudnn_window.py) ----

WN, WW = 320, 64        # slots (not a multiple of cuDNN's tiles) and the window


def window_layout(kind: str):
  """positions, segment_ids, valid `[B, WN]`: 'one' document per row (plain lengths),
  'padding' after it, or 'documents' (an empty-cache prefix, documents mid-row, padding)."""
  positions = np.tile(np.arange(4000, 4000 + WN, dtype=np.int32), (B, 1))
  segments = np.full((B, WN), 5, np.int32)
  valid = np.ones((B, WN), bool)
  if kind == 'padding':
    valid[0, 250:] = False
  if kind == 'documents':
    valid[0, :70] = False
    segments[0, :70] = 4
    segments[0, 200:] = 6
    segments[1, 100:] = 6
    segments[1, 130:] = 7
    valid[1, 300:] = False
  return tuple(jnp.asarray(a) for a in (positions, segments, valid))


@pytest.mark.parametrize('kind', ['one', 'padding', 'documents'])
@pytest.mark.parametrize('with_lse', [False, True])
def test_cudnn_window_equals_its_xla_description(kind, with_lse):
  """cuDNN's sliding window over packed segments equals the same description run by XLA
  (which tests/attention/test_cudnn_window.py holds to the dense rule on positions): outputs, the
  log-sum-exp, and gradients through both."""
  from longformer_jax.attention.core import cudnn_window
  from longformer_jax.attention.core.sliding_window import blocked_window_attention
  positions, segments, valid = window_layout(kind)
  keys = jax.random.split(jax.random.PRNGKey(1), 5)
  q, k, v = (jax.random.normal(key, (B, WN, H, HD)).astype(jnp.bfloat16) for key in keys[:3])
  probe = jax.random.normal(keys[3], (B, WN, H, HD)) * valid[..., None, None]
  lse_probe = jax.random.normal(keys[4], (B, WN, H)) * valid[..., None]
  fallback = lambda q, k, v: blocked_window_attention(
      q, k, v, positions, segments, positions, segments, valid, window=WW, block_size=64,
      causal=True, scale=HD ** -0.5)

  def objective(implementation):
    def f(q, k, v):
      result = cudnn_window.window_attention(
          q, k, v, positions, segments, valid, window=WW, scale=HD ** -0.5,
          fallback=fallback, with_lse=with_lse, implementation=implementation)
      out, lse = result if with_lse else (result, jnp.zeros((B, WN, H)))
      lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
      return jnp.sum(out * probe) + jnp.sum(lse * lse_probe), (out, lse)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))

  (_, (out, lse)), grads = objective('cudnn')(q, k, v)
  (_, (want_out, want_lse)), want_grads = objective('xla')(q, k, v)
  rows = np.asarray(valid)
  np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(want_out, np.float32)[rows],
                             **TOLERANCE)
  np.testing.assert_allclose(np.asarray(lse)[rows], np.asarray(want_lse)[rows], atol=2e-2)
  for got, want, what in zip(grads, want_grads, 'qkv'):
    scale = float(jnp.max(jnp.abs(want.astype(jnp.float32)))) + 1e-6
    np.testing.assert_allclose(np.asarray(got, np.float32) / scale,
                               np.asarray(want, np.float32) / scale, atol=3e-2, err_msg=f'd{what}')


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('global_tokens', [0, 2])
def test_longformer_layer_cudnn_equals_xla(global_tokens, causal):
  """The Longformer (causal: window cache; two-sided: two causal passes; documents, padding,
  global tokens) in bfloat16: 'cudnn' (auto's choice on a GPU) against 'xla', two chunks,
  outputs and gradients."""
  from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
  from tests.support.tiny_models import shared_settings
  from tests.support.cudnn_window_runs import CHUNK, chunk_contexts
  contexts = chunk_contexts(bool(global_tokens))
  valid = jnp.concatenate([c.valid for c in contexts], axis=1)
  x = jax.random.normal(jax.random.PRNGKey(3), (B, 2 * CHUNK, D))
  probe = jax.random.normal(jax.random.PRNGKey(4), (B, 2 * CHUNK, D)) * valid[..., None]
  make = lambda backend: LongformerAttention(
      config=LongformerConfig(window=6, head_dilations=','.join(['1'] * H), window_cache=causal,
                              global_tokens=global_tokens),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=causal,
                             attention_backend=backend), dtype=jnp.bfloat16)
  state = fifo.create(B, 6 if causal else 0, (D,))   # the window cache: w hidden states
  params = make('xla').init(jax.random.PRNGKey(0), x[:, :CHUNK], state, contexts[0])['params']

  @jax.jit
  def run(params):
    results = {}
    for backend in ('cudnn', 'xla'):
      module = make(backend)

      def two_chunks(p):
        s, outs = state, []
        for c, ctx in enumerate(contexts):
          out, s, _ = module.apply({'params': p}, x[:, c * CHUNK:(c + 1) * CHUNK], s, ctx)
          outs.append(out.astype(jnp.float32))
        return jnp.concatenate(outs, axis=1)
      out, pullback = jax.vjp(two_chunks, params)
      results[backend] = (out, pullback(probe))
    return results

  results = run(params)
  rows = np.asarray(valid)
  np.testing.assert_allclose(np.asarray(results['cudnn'][0])[rows],
                             np.asarray(results['xla'][0])[rows], **TOLERANCE)
  for got, want in zip(jax.tree_util.tree_leaves(nn.meta.unbox(results['cudnn'][1])),
                       jax.tree_util.tree_leaves(nn.meta.unbox(results['xla'][1]))):
    scale = float(jnp.max(jnp.abs(want.astype(jnp.float32)))) + 1e-6
    np.testing.assert_allclose(np.asarray(got, np.float32) / scale,
                               np.asarray(want, np.float32) / scale, atol=3e-2)


def test_streaming_window_layer_cudnn_equals_xla():
  """StreamingLLM's layer without sinks (imported Mistral / Qwen2 windows) in bfloat16:
  'cudnn' against 'xla' over two chunks (window FIFO carried), outputs and gradients."""
  from longformer_jax.attention.streaming_sinks import StreamingSinkAttention, StreamingSinksConfig
  from tests.support.cudnn_window_runs import (D as d, H as h, HD as hd, chunk_contexts,
                                               two_chunk_run)
  w = 7
  make = lambda backend: StreamingSinkAttention(
      config=StreamingSinksConfig(num_sinks=0, window=w),
      shared=shared_settings(num_heads=h, head_dim=hd, d_model=d, attention_backend=backend),
      dtype=jnp.bfloat16)
  state = {'sinks': fifo.create(B, 0, (h, 2 * hd)), 'window': fifo.create(B, w - 1, (h, 2 * hd)),
           'doc_start': jnp.zeros((B,), jnp.int32), 'last_segment': jnp.full((B,), -1, jnp.int32)}
  contexts = chunk_contexts(False)
  params, *want = two_chunk_run(make, state, contexts, 'xla')
  _, *got = two_chunk_run(make, state, contexts, 'cudnn', params)
  np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32),
                             **TOLERANCE)
  for g, r in zip(jax.tree_util.tree_leaves(nn.meta.unbox(got[2])),
                  jax.tree_util.tree_leaves(nn.meta.unbox(want[2]))):
    scale = float(jnp.max(jnp.abs(r.astype(jnp.float32)))) + 1e-6
    np.testing.assert_allclose(np.asarray(g, np.float32) / scale, np.asarray(r, np.float32) / scale,
                               atol=3e-2)

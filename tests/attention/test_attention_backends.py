"""Kernel backends (`model.attention_backend`) against the dense float32 reference.

The reference is the masked softmax of `attention/core/dot_product.py` with a
mask built from positions (`masking.causal_document_mask` and the window rule
`-left <= p_k - p_q <= right`). The splash kernel runs in Pallas interpret
mode on CPU; the cuDNN wrapper is checked here through
`implementation='xla'` (its argument plumbing: window convention, mask,
empty rows) and on a GPU in tests/attention/test_cudnn_attention.py.

Inputs: two rows, positions starting at 1000 (not at 0), documents starting
inside the chunk, padding at the end and inside a document (so some padding
queries have no key at all and must give 0), a chunk length (40) that is not
a multiple of the kernel's 128-lane blocks and one (300) that spans several.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.core import attention_backend
from longformer_jax.attention.core.attention_backend import KernelPattern, resolve_backend
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.vanilla.cudnn_attention import cudnn_attention
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.core.splash_kernels import splash_attention
from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
from longformer_jax.attention.vanilla.attention import VanillaAttention
from longformer_jax.config.errors import ConfigError
from tests.support.backend_comparison import (B, D, H, HD, assert_trees_close, chunk_context,
                                              layer_outputs_and_grads, resolve)
from tests.support.tiny_models import shared_settings

# (left, right): causal, bidirectional, Longformer causal w=5, two-sided w=5,
# StreamingLLM window of the 4 most recent tokens (left = w - 1).
PATTERNS = {'causal': (None, 0), 'bidirectional': (None, None), 'longformer_causal': (5, 0),
            'longformer_two_sided': (5, 5), 'recent_window': (3, 0)}


def reference_mask(ctx: AttentionContext, left, right) -> jax.Array:
  """`[b, q, k]` bool from positions: document, padding and the window rule."""
  p = ctx.positions
  mask = causal_document_mask(p, ctx.segment_ids, p, ctx.segment_ids, ctx.valid, causal=False)
  offset = p[:, None, :] - p[:, :, None]                # p_k - p_q
  if left is not None:
    mask &= offset >= -left
  if right is not None:
    mask &= offset <= right
  return mask


def random_qkv(chunk: int, seed: int = 0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v = (jax.random.normal(key, (B, chunk, H, HD), jnp.float32) for key in keys[:3])
  probe = jax.random.normal(keys[3], (B, chunk, H, HD), jnp.float32)
  return q * HD ** -0.5, k, v, probe


def outputs_and_grads(fn, q, k, v, probe):
  """`fn(q, k, v)` and the gradients of `sum(fn * probe)` w.r.t. q, k, v."""
  out, pullback = jax.vjp(fn, q, k, v)
  return out, pullback(probe)


def dense(ctx, left, right):
  mask = reference_mask(ctx, left, right)
  return lambda q, k, v: attend(jnp.einsum('bqhd,bkhd->bhqk', q, k), mask, v)


def splash(ctx, left, right):
  return lambda q, k, v: splash_attention(q, k, v, ctx.segment_ids, ctx.valid,
                                          left=left, right=right)


@pytest.fixture(scope='module')
def kernel_results():
  """Every pattern at chunk 40 and the Longformer window at chunk 300, in one jit."""
  cases = {name: (40, lr) for name, lr in PATTERNS.items()}
  cases['longformer_causal_300'] = (300, PATTERNS['longformer_causal'])

  @jax.jit
  def run():
    results = {}
    for name, (chunk, (left, right)) in cases.items():
      ctx, (q, k, v, probe) = chunk_context(chunk), random_qkv(chunk)
      results[name] = (outputs_and_grads(splash(ctx, left, right), q, k, v, probe),
                       outputs_and_grads(dense(ctx, left, right), q, k, v, probe),
                       reference_mask(ctx, left, right))
    return results
  return run()


@pytest.mark.parametrize('name', list(PATTERNS) + ['longformer_causal_300'])
def test_splash_equals_dense_reference(kernel_results, name):
  (out, grads), (expected, expected_grads), mask = kernel_results[name]
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)
  for got, want, what in zip(grads, expected_grads, 'qkv'):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4, err_msg=f'd{what}')
  empty = ~np.asarray(mask).any(-1)                   # padding queries with no key
  assert empty.any(), 'the inputs must contain queries with no allowed key'
  np.testing.assert_array_equal(np.asarray(out)[empty], 0.0)


@pytest.mark.parametrize('name', ['causal', 'longformer_causal', 'bidirectional'])
def test_cudnn_wrapper_plumbing_equals_dense_reference(name):
  """The cuDNN call through XLA (`implementation='xla'`), bfloat16 inputs."""
  left, right = PATTERNS[name]
  ctx, (q, k, v, _) = chunk_context(40), random_qkv(40)
  q = q * HD ** 0.5                                    # unscaled: the wrapper scales
  out = jax.jit(lambda q, k, v: cudnn_attention(
      q, k, v, reference_mask(ctx, left, right), scale=HD ** -0.5, causal=right == 0,
      window=left, implementation='xla'))(q, k, v)
  cast = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  expected = dense(ctx, left, right)(cast(q) * HD ** -0.5, cast(k), cast(v))
  np.testing.assert_allclose(out.astype(jnp.float32), expected, atol=3e-2, rtol=3e-2)


def test_vanilla_layer_splash_equals_xla():
  results = layer_outputs_and_grads(lambda backend: VanillaAttention(shared=shared_settings(
      num_heads=H, head_dim=HD, d_model=D, causal=True, attention_backend=backend)))
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


def test_longformer_two_sided_layer_splash_equals_xla():
  results = layer_outputs_and_grads(lambda backend: LongformerAttention(
      config=LongformerConfig(window=5, head_dilations='1,1', window_cache=False),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=False,
                             attention_backend=backend)))
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


@pytest.mark.parametrize('model, rule', [
    (dict(attention_backend='flash'), 'is not an attention backend'),
    (dict(attention_backend='cudnn'), 'cuDNN runs on GPU only'),
    (dict(attention_backend='splash', mem_len=16), 'memory before the chunk'),
    (dict(attention='xl', mem_len=16, attention_backend='splash'), 'has no kernel backend'),
    (dict(attention='longformer', attention_backend='splash'), 'memory before the chunk'),
    (dict(attention='longformer', attention_backend='splash', causal=False,
          longformer=dict(global_tokens=2)), 'global tokens'),
])
def test_bad_backend_is_a_config_error_naming_the_key(model, rule):
  with pytest.raises(ConfigError) as error:
    resolve(**model)
  assert error.value.key == 'model.attention_backend'
  assert rule in str(error.value)


@pytest.mark.parametrize('model', [
    dict(attention_backend='splash'), dict(attention_backend='splash', causal=False),
    dict(attention='longformer', attention_backend='splash', causal=False),
    dict(attention='longformer', attention_backend='splash', longformer=dict(window_cache=False)),
    dict(attention='longformer', attention_backend='splash', causal=False,
         longformer=dict(dilation=2)),
    dict(attention='xl', mem_len=16, attention_backend='xla'),
    dict(attention='xl', mem_len=16),
])
def test_good_backends_resolve(model):
  assert resolve(**model)['attention_backend'] == model.get('attention_backend', 'auto')


CAUSAL = KernelPattern(right=0)
WINDOW_O_NW = KernelPattern(left=8, right=0, dense_mask_ok=False)


@pytest.mark.parametrize('requested, pattern, platform, dtype, expected', [
    ('auto', CAUSAL, 'cpu', 'float32', 'xla'),
    ('auto', CAUSAL, 'tpu', 'float32', 'splash'),
    ('auto', KernelPattern(right=0, in_chunk=False), 'tpu', 'float32', 'xla'),
    ('auto', KernelPattern(left=8, right=0, unsupported='global tokens'), 'tpu', 'float32', 'xla'),
    ('auto', CAUSAL, 'gpu', 'bfloat16', 'cudnn'),
    ('auto', KernelPattern(right=0, in_chunk=False), 'gpu', 'bfloat16', 'cudnn'),
    ('auto', CAUSAL, 'gpu', 'float32', 'xla'),
    ('auto', WINDOW_O_NW, 'gpu', 'bfloat16', 'xla'),
    ('auto', KernelPattern(left=8, right=8), 'gpu', 'bfloat16', 'xla'),
    ('xla', CAUSAL, 'tpu', 'float32', 'xla'),
    ('splash', CAUSAL, 'cpu', 'float32', 'splash'),
    ('cudnn', CAUSAL, 'gpu', 'bfloat16', 'cudnn'),
])
def test_auto_and_explicit_choices(requested, pattern, platform, dtype, expected):
  assert resolve_backend(requested, pattern, dtype=dtype, head_dim=64,
                         platform=platform) == expected


@pytest.mark.parametrize('requested, pattern, platform, dtype, head_dim', [
    ('splash', CAUSAL, 'gpu', 'bfloat16', 64),
    ('cudnn', CAUSAL, 'gpu', 'float32', 64),
    ('cudnn', CAUSAL, 'gpu', 'bfloat16', 12),
    ('cudnn', WINDOW_O_NW, 'gpu', 'bfloat16', 64),
    ('cudnn', CAUSAL, 'tpu', 'bfloat16', 64),
])
def test_impossible_explicit_choices_raise(requested, pattern, platform, dtype, head_dim):
  with pytest.raises(ConfigError) as error:
    resolve_backend(requested, pattern, dtype=dtype, head_dim=head_dim, platform=platform)
  assert error.value.key == attention_backend.KEY

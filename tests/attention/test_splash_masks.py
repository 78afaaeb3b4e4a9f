"""Splash masks beyond a window: Sparse Transformer and Image Transformer local 1D (causal
and bidirectional).

The splash kernel (`attention/core/splash_kernels.py`, Pallas interpret mode on
CPU) with the rules of `attention/sparse_transformer/splash.py` and
`attention/image_local/splash.py` is held to the dense float32 masked softmax
(`dot_product.attend`) with a mask built here independently, in numpy, from
the papers' rules on positions (relative to the chunk's first token),
documents and padding: outputs and gradients w.r.t. q, k, v. The mask objects
themselves are checked against the rules written as Python loops over (query, key) at small sizes.

Inputs (as tests/attention/test_attention_backends.py): two rows, positions starting at
1000, row 0 padded from 3/4 on (a document id of its own: its queries see no
key), row 1 with documents starting at n // 3 and 2n // 3 (inside a block of
the stride) and the first three tokens of the second invalid; chunk 200 (not a
multiple of 128) and 384 (three 128 blocks: block-sparse skipping).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.core import attention_backend
from longformer_jax.attention.sparse_transformer import splash as sparse_splash
from longformer_jax.attention.core import splash_kernels as sk
from longformer_jax.attention.image_local.splash import image_local_1d_splash
from longformer_jax.attention.core.splash_kernels import splash_attention
from tests.support.splash_mask_reference import (ATOL, RTOL, STRIDE, SUMMARY, chunk_facts, compare,
                                                 random_qkv, rule_np)


# ---- the rules, written from the papers (independent of the code under test) ----

def rule_loop(name: str, i: int, j: int, stride: int = STRIDE, summary: int = SUMMARY,
              query_len: int = 0, memory_len: int = 0) -> bool:
  """One (query i, key j) pair, positions relative to the chunk start, Python ints."""
  if name == 'strided_local':          # the previous l positions, self included
    return 0 <= i - j < stride
  if name == 'strided_summary':        # every l-th position back
    return i - j >= 0 and (i - j) % stride == 0
  if name == 'fixed_local':            # the query's own block
    return j <= i and j // stride == i // stride
  if name == 'fixed_summary':          # the last c positions of every block
    return j <= i and j % stride >= stride - summary
  if name == 'strided':
    return rule_loop('strided_local', i, j, stride) or rule_loop('strided_summary', i, j, stride)
  if name == 'fixed':
    return (rule_loop('fixed_local', i, j, stride)
            or rule_loop('fixed_summary', i, j, stride, summary))
  if name == 'image_1d':               # own query block and memory_len before it, causal
    block_start = (i // query_len) * query_len
    return block_start - memory_len <= j <= i
  if name == 'image_1d_bidirectional':  # own query block and memory_len before and after it
    block_start = (i // query_len) * query_len
    return block_start - memory_len <= j < block_start + query_len + memory_len
  if name.startswith('window'):        # window_<left>_<right>
    left, right = (int(x) for x in name.split('_')[1:])
    return -left <= j - i <= right
  raise ValueError(name)


def sparse(pattern, integration, heads):
  """(kernel_fn, the reference's rule per head) of a Sparse Transformer layer."""
  fn = lambda q, k, v, seg, valid: sparse_splash.sparse_transformer_splash(
      q, k, v, seg, valid, pattern=pattern, stride=STRIDE, summary_len=SUMMARY,
      integration=integration)
  if integration == 'multihead':
    rules = [f'{pattern}_local'] * (heads // 2) + [f'{pattern}_summary'] * (heads - heads // 2)
  else:
    rules = [pattern] * heads
  return fn, rules


# ---- default suite: four kernel cases (each a few seconds) and the mask objects ----

def test_strided_merged_equals_dense_reference():
  fn, rules = sparse('strided', 'merged', heads=2)
  compare(fn, rules, chunk=384)


def test_fixed_multihead_equals_dense_reference():
  """Different masks per head: the kernel loads partial mask blocks."""
  fn, rules = sparse('fixed', 'multihead', heads=4)
  compare(fn, rules, chunk=384)


def test_window_through_the_mask_description_equals_dense_reference():
  """Regression: `mask=Window(5, 0)` (and a per-head tuple of it) is today's `left=5, right=0`."""
  fn = lambda q, k, v, seg, valid: splash_attention(q, k, v, seg, valid,
                                                    mask=(sk.Window(5, 0),) * 2)
  compare(fn, ['window_5_0'] * 2, chunk=200)
  assert sk.head_rules(sk.Window(5, 0), 2) == sk.head_rules((sk.Window(5, 0),) * 2, 2)


def test_image_local_1d_equals_dense_reference():
  fn = lambda q, k, v, seg, valid: image_local_1d_splash(q, k, v, seg, valid, query_len=24,
                                                         memory_len=40)
  compare(fn, ['image_1d'] * 2, chunk=200, query_len=24, memory_len=40)


def test_image_local_1d_bidirectional_equals_dense_reference():
  fn = lambda q, k, v, seg, valid: image_local_1d_splash(q, k, v, seg, valid, query_len=24,
                                                         memory_len=40, causal=False)
  compare(fn, ['image_1d_bidirectional'] * 2, chunk=200, query_len=24, memory_len=40)


MASK_CASES = {
    'strided_local': sk.Strided(STRIDE, 'local'),
    'strided_summary': sk.Strided(STRIDE, 'summary'),
    'fixed_local': sk.Fixed(STRIDE, 'local'),
    'fixed_summary': sk.Fixed(STRIDE, 'summary', SUMMARY),
    'strided': sk.Union((sk.Strided(STRIDE, 'local'), sk.Strided(STRIDE, 'summary'))),
    'fixed': sk.Union((sk.Fixed(STRIDE, 'local'), sk.Fixed(STRIDE, 'summary', SUMMARY))),
    'image_1d': sk.BlockLocal(24, 40),
    'image_1d_bidirectional': sk.BlockLocal(24, 40, causal=False),
    'window_5_0': sk.Window(5, 0),
    'window_3_7': sk.Window(3, 7),
}


@pytest.mark.parametrize('name', list(MASK_CASES))
def test_mask_objects_equal_the_rules(name):
  """The splash mask object (as the kernel's mask-info sees it) and its in-kernel rule on
  jnp arrays equal the rule written as Python loops, at n = 80."""
  n = 80
  args = dict(query_len=24, memory_len=40) if name.startswith('image_1d') else {}
  expected = np.array([[rule_loop(name, i, j, **args) for j in range(n)] for i in range(n)])
  mask = sk.head_mask(n, MASK_CASES[name])
  np.testing.assert_array_equal(mask[0:n, 0:n], expected)
  np.testing.assert_array_equal(mask[16:48, 32:80], expected[16:48, 32:80])   # a block
  ids = jnp.arange(n, dtype=jnp.int32)
  np.testing.assert_array_equal(MASK_CASES[name].allows(ids[:, None], ids[None, :]), expected)
  np.testing.assert_array_equal(rule_np(name, np.arange(n)[:, None], np.arange(n)[None, :],
                                        **args), expected)
  assert hash(mask) == hash(sk.head_mask(n, MASK_CASES[name])) and mask == sk.head_mask(
      n, MASK_CASES[name])


@pytest.mark.parametrize('pattern, integration, heads, expected', [
    ('strided', 'merged', 2, ['strided', 'strided']),
    ('fixed', 'multihead', 4, ['fixed_local'] * 2 + ['fixed_summary'] * 2),
    ('strided', 'multihead', 3, ['strided_local'] + ['strided_summary'] * 2),
    ('fixed_summary', 'merged', 2, ['fixed_summary'] * 2),
])
def test_pattern_rules_per_head(pattern, integration, heads, expected):
  rules = sparse_splash.pattern_rules(pattern, integration, STRIDE, SUMMARY, heads)
  n = 64
  for rule, name in zip(rules, expected, strict=True):
    want = np.array([[rule_loop(name, i, j) for j in range(n)] for i in range(n)])
    np.testing.assert_array_equal(sk.head_mask(n, rule)[0:n, 0:n], want)


def test_sparse_transformer_resolves_to_splash_on_tpu_and_pallas_on_gpu():
  section = type('Section', (), dict(pattern='strided'))()
  pattern = sparse_splash.kernel_pattern(type('Model', (), dict(causal=True))(), section)
  resolve = lambda requested, platform: attention_backend.resolve_backend(
      requested, pattern, dtype='bfloat16', head_dim=64, platform=platform)
  assert resolve('auto', 'tpu') == 'splash'
  assert resolve('splash', 'cpu') == 'splash'
  assert resolve('auto', 'gpu') == 'pallas_gpu'
  assert resolve('auto', 'cpu') == 'xla'


# ---- slow: the other integrations and components, and the modules' own XLA paths ----

@pytest.mark.slow
@pytest.mark.parametrize('pattern, integration, heads', [
    ('strided', 'multihead', 4), ('fixed', 'merged', 2), ('strided_local', 'merged', 2),
    ('strided_summary', 'merged', 2), ('fixed_local', 'merged', 2),
    ('fixed_summary', 'merged', 2),
])
def test_sparse_patterns_equal_dense_reference(pattern, integration, heads):
  fn, rules = sparse(pattern, integration, heads)
  compare(fn, rules, chunk=384)


@pytest.mark.slow
def test_strided_merged_short_chunk_equals_dense_reference():
  fn, rules = sparse('strided', 'merged', heads=2)
  compare(fn, rules, chunk=200)


@pytest.mark.slow
@pytest.mark.parametrize('pattern, integration', [('strided', 'merged'), ('fixed', 'merged'),
                                                  ('strided', 'multihead'),
                                                  ('fixed', 'multihead')])
def test_sparse_splash_equals_the_modules_blocked_xla(pattern, integration):
  """The same inputs through `sparse_transformer.sparse_transformer_attention` (XLA)."""
  from longformer_jax.attention.sparse_transformer import attention as sparse_transformer
  chunk, heads = 200, 4
  positions, segments, valid = (jnp.asarray(a) for a in chunk_facts(chunk))
  q, k, v, _ = random_qkv(chunk, heads)
  got = jax.jit(lambda q, k, v: sparse_splash.sparse_transformer_splash(
      q, k, v, segments, valid, pattern=pattern, stride=STRIDE, summary_len=SUMMARY,
      integration=integration))(q, k, v)
  want = jax.jit(lambda q, k, v: sparse_transformer.sparse_transformer_attention(
      q, k, v, positions, segments, valid, pattern=pattern, stride=STRIDE,
      summary_len=SUMMARY, integration=integration))(q, k, v)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_image_local_1d_splash_equals_the_modules_gathered_xla():
  from longformer_jax.attention.image_local import attention as image_local
  chunk, heads, query_len, memory_len = 200, 2, 24, 40
  positions, segments, valid = (jnp.asarray(a) for a in chunk_facts(chunk))
  q, k, v, _ = random_qkv(chunk, heads)
  slots = image_local.local_1d_key_slots(chunk, query_len, memory_len)
  got = jax.jit(lambda q, k, v: image_local_1d_splash(
      q, k, v, segments, valid, query_len=query_len, memory_len=memory_len))(q, k, v)
  want = jax.jit(lambda q, k, v: image_local.gathered_local_attention(
      q, k, v, positions, segments, valid, slots, query_len))(q, k, v)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize('causal', [True, False])
def test_image_local_1d_layer_splash_equals_xla(causal):
  """The whole layer with `attention_backend='splash'` and 'xla': output and gradients."""
  from tests.support.backend_comparison import assert_trees_close, layer_outputs_and_grads
  from longformer_jax.attention.image_local.attention import ImageLocalAttention, ImageLocalConfig
  from tests.support.tiny_models import shared_settings
  config = ImageLocalConfig(query_len=8, memory_len=8)
  results = layer_outputs_and_grads(lambda backend: ImageLocalAttention(
      config=config, shared=shared_settings(num_heads=2, head_dim=16, d_model=32,
                                            attention_backend=backend, causal=causal)))
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


def test_sparse_transformer_layer_splash_equals_xla():
  """The whole layer (fixed, multihead) with `attention_backend='splash'` and 'xla'."""
  from tests.support.backend_comparison import assert_trees_close, layer_outputs_and_grads
  from tests.support.tiny_models import shared_settings
  from longformer_jax.attention.sparse_transformer.attention import (SparseTransformerAttention,
                                                           SparseTransformerConfig)
  config = SparseTransformerConfig(pattern='fixed', stride=8, summary_len=2,
                                   integration='multihead')
  results = layer_outputs_and_grads(lambda backend: SparseTransformerAttention(
      config=config, shared=shared_settings(num_heads=2, head_dim=16, d_model=32,
                                            attention_backend=backend)))
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)

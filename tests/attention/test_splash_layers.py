"""Splash paths of the Longformer's dilated windows and BigBird's block pattern.

The splash kernel (Pallas interpret mode on CPU) with `DilatedWindow` (per
head) and bigbird_splash's `BigBirdBlocks` is held to the dense float32 masked
softmax with a mask built here, in numpy, from the papers' rules on positions
relative to the chunk's first token, documents and padding (the inputs of
tests/support/splash_mask_reference.py: positions from 1000, documents starting mid-chunk,
padding, queries with no key that must give 0): outputs and gradients w.r.t.
q, k, v to 1e-5. The mask objects are checked against the rules written as
Python loops, and each wired layer with `attention_backend='splash'` equals
`'xla'` (same parameters; outputs and gradients w.r.t. parameters and inputs).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.bigbird import attention as bigbird
from longformer_jax.attention.bigbird.attention import BigBirdAttention, BigBirdConfig
from longformer_jax.attention.core import attention_backend
from longformer_jax.attention.bigbird import splash as bigbird_splash
from longformer_jax.attention.core import splash_kernels as sk
from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
from longformer_jax.config.errors import ConfigError
from tests.support.backend_comparison import assert_trees_close, layer_outputs_and_grads, resolve
from tests.support.bigbird_loop_reference import BB, bigbird_loop, random_table, reference_mask
from tests.support.splash_mask_reference import chunk_facts, compare_with_mask, random_qkv
from tests.support.tiny_models import shared_settings

RTOL, ATOL = 1e-5, 1e-5
WINDOW = 4


# ---- the rules, written from the papers (independent of the code under test) ----

def dilated_loop(i: int, j: int, window: int, dilation: int, causal: bool) -> bool:
  """sliding_window.py: causal 0 <= i - j <= w d, two-sided |i - j| <= w d; (i - j) % d == 0."""
  near = 0 <= i - j <= window * dilation if causal else abs(i - j) <= window * dilation
  return near and (i - j) % dilation == 0


def loop_mask(rule, n: int) -> np.ndarray:
  return np.array([[rule(i, j) for j in range(n)] for i in range(n)])


# Splash vs the dense masked softmax (tests/support/splash_mask_reference.py).
compare = compare_with_mask


# ---- mask objects against the loops (cheap) ----

@pytest.mark.parametrize('dilation, causal', [(2, True), (3, False), (1, True), (3, True)])
def test_dilated_window_rules_equal_the_loops(dilation, causal):
  n = 80
  rule = sk.dilated_window_rules(WINDOW, (dilation,), causal)[0]
  expected = loop_mask(lambda i, j: dilated_loop(i, j, WINDOW, dilation, causal), n)
  mask = sk.head_mask(n, rule)
  np.testing.assert_array_equal(mask[0:n, 0:n], expected)
  np.testing.assert_array_equal(mask[16:48, 32:80], expected[16:48, 32:80])
  ids = jnp.arange(n, dtype=jnp.int32)
  np.testing.assert_array_equal(rule.allows(ids[:, None], ids[None, :]), expected)
  assert isinstance(rule, sk.Window if dilation == 1 else sk.DilatedWindow)


@pytest.mark.parametrize('causal', [False, True])
def test_bigbird_rule_equals_the_loops(causal):
  n = 96                                   # 6 blocks of 16
  table = random_table(n // BB['block'], causal)
  rule = bigbird_splash.BigBirdBlocks(causal=causal, random=table, **BB)
  expected = loop_mask(lambda i, j: bigbird_loop(i, j, table, causal=causal, **BB), n)
  mask = sk.head_mask(n, rule)
  assert isinstance(mask, sk.LoadedRuleMask)
  np.testing.assert_array_equal(mask[0:n, 0:n], expected)
  np.testing.assert_array_equal(mask[16:48, 32:96], expected[16:48, 32:96])
  ids = jnp.arange(n, dtype=jnp.int32)
  np.testing.assert_array_equal(rule.allows(ids[:, None], ids[None, :]), expected)
  # Padded slots past the last block (the kernel's 128 lanes) clip, never fail.
  assert sk.head_mask(128, rule)[0:128, 0:128].shape == (128, 128)
  assert hash(mask) == hash(sk.head_mask(n, rule)) and mask == sk.head_mask(n, rule)


# ---- kernels against the dense reference ----

@pytest.mark.slow
def test_dilated_heads_two_sided_equal_dense_reference():
  """Heads of dilation 1 and 3 (a LocalMask and a DilatedWindow rule), two-sided, chunk 200."""
  dilations = (1, 3)
  fn = lambda q, k, v, seg, valid: sk.splash_attention(
      q, k, v, seg, valid, mask=sk.dilated_window_rules(WINDOW, dilations, causal=False))
  mask = reference_mask([lambda i, j, d=d: dilated_loop(i, j, WINDOW, d, False)
                         for d in dilations], 200)
  compare(fn, mask, 200)


@pytest.mark.slow
def test_dilated_heads_causal_equal_dense_reference():
  dilations = (2, 5)
  fn = lambda q, k, v, seg, valid: sk.splash_attention(
      q, k, v, seg, valid, mask=sk.dilated_window_rules(WINDOW, dilations, causal=True))
  mask = reference_mask([lambda i, j, d=d: dilated_loop(i, j, WINDOW, d, True)
                         for d in dilations], 200)
  compare(fn, mask, 200)


def bigbird_reference(chunk: int, causal: bool, table) -> np.ndarray:
  """Sparse rows, then the rows of valid global queries (first g blocks) see the whole chunk."""
  sparse = reference_mask([lambda i, j: bigbird_loop(i, j, table, causal=causal, **BB)] * 2,
                          chunk)
  rows = reference_mask([lambda i, j: bigbird_loop(i, j, table, causal=causal,
                                                   global_rows=True, **BB)] * 2, chunk)
  _, _, valid = chunk_facts(chunk)
  return np.where(valid[:, None, :, None], rows, sparse)


@pytest.mark.slow
@pytest.mark.parametrize('causal', [False, True])
def test_bigbird_splash_equals_dense_reference(causal):
  """Chunk 384: three 128 blocks, block-sparse skipping of the BigBird pattern."""
  chunk = 384
  table = random_table(chunk // BB['block'], causal)
  fn = lambda q, k, v, seg, valid: bigbird_splash.bigbird_splash(
      q, k, v, seg, valid, table, causal=causal, **BB)
  compare(fn, bigbird_reference(chunk, causal, table), chunk)


@pytest.mark.slow
@pytest.mark.parametrize('causal', [False, True])
def test_bigbird_splash_equals_the_modules_blocked_xla(causal):
  chunk, heads = 200, 2
  positions, segments, valid = (jnp.asarray(a) for a in chunk_facts(chunk))
  q, k, v, _ = random_qkv(chunk, heads)
  num_blocks = -(-chunk // BB['block'])
  table = random_table(num_blocks, causal)
  got = jax.jit(lambda q, k, v: bigbird_splash.bigbird_splash(
      q, k, v, segments, valid, table, causal=causal, **BB))(q, k, v)
  want = jax.jit(lambda q, k, v: bigbird.bigbird_attention(
      q, k, v, positions, segments, valid, None, jnp.asarray(table), max_global_tokens=0,
      causal=causal, **BB))(q, k, v)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# ---- the layers: splash == xla ----

def longformer(dilations, causal):
  config = LongformerConfig(window=WINDOW, head_dilations=','.join(map(str, dilations)),
                            window_cache=False)
  return lambda backend: LongformerAttention(
      config=config, shared=shared_settings(num_heads=2, head_dim=16, d_model=32, causal=causal,
                                            attention_backend=backend))


def test_longformer_dilated_layer_splash_equals_xla():
  """Two-sided, heads of dilation 1 and 3, chunk 128 (one kernel block)."""
  results = layer_outputs_and_grads(longformer((1, 3), causal=False), chunk=128)
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


@pytest.mark.slow
def test_longformer_dilated_causal_layer_splash_equals_xla():
  """`window_cache=False`, causal, heads of dilation 2 and 2, chunk 200."""
  results = layer_outputs_and_grads(longformer((2, 2), causal=True), chunk=200)
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


def bigbird_layer(causal):
  config = BigBirdConfig(block=16, window_blocks=1, random_blocks=2, global_blocks=1, seed=3)
  return lambda backend: BigBirdAttention(
      config=config, layer_index=1,
      shared=shared_settings(num_heads=2, head_dim=16, d_model=32, causal=causal,
                             attention_backend=backend))


def test_bigbird_layer_splash_equals_xla():
  """Bidirectional, chunk 128 (8 blocks: window, 2 random blocks, 1 ITC block)."""
  results = layer_outputs_and_grads(bigbird_layer(causal=False), chunk=128)
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


@pytest.mark.slow
def test_bigbird_causal_layer_splash_equals_xla():
  results = layer_outputs_and_grads(bigbird_layer(causal=True), chunk=200)
  assert_trees_close(results['splash'], results['xla'], atol=2e-5)


# ---- backend choice ----

def test_dilated_longformer_and_bigbird_resolve_to_splash():
  assert resolve(attention='longformer', attention_backend='splash', causal=False,
                 longformer=dict(dilation=2))['attention_backend'] == 'splash'
  assert resolve(attention='longformer', attention_backend='splash',
                 longformer=dict(head_dilations='1,2', window_cache=False)
                 )['attention_backend'] == 'splash'
  assert resolve(attention='bigbird', attention_backend='splash', causal=False
                 )['attention_backend'] == 'splash'
  section = bigbird.BigBirdConfig()
  model = type('Model', (), dict(causal=False))()
  pattern = bigbird_splash.kernel_pattern(model, section)
  choose = lambda requested, platform: attention_backend.resolve_backend(
      requested, pattern, dtype='bfloat16', head_dim=64, platform=platform)
  assert (choose('auto', 'tpu'), choose('auto', 'gpu'), choose('auto', 'cpu')) == (
      'splash', 'pallas_gpu', 'xla')     # on a GPU: the Pallas block-sparse kernel


@pytest.mark.parametrize('model, rule', [
    (dict(attention='bigbird', attention_backend='splash', causal=False,
          bigbird=dict(max_global_tokens=2)), 'flags'),
    (dict(attention='bigbird', attention_backend='cudnn', causal=False), 'GPU only'),
    (dict(attention='longformer', attention_backend='splash', longformer=dict(dilation=2)),
     'memory before the chunk'),
])
def test_refused_kernels_are_config_errors(model, rule):
  with pytest.raises(ConfigError) as error:
    resolve(**model)
  assert error.value.key == 'model.attention_backend'
  assert rule in str(error.value)

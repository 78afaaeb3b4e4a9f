"""The bidirectional Sparse Transformer (`model.causal=False`, an encoder) against references.

The reference writes each component's bidirectional rule (the causal rules of
Child et al. (2019), section 4.3, mirrored: LRA ran the Sparse Transformer as
an encoder) as Python on one (query, key) pair of positions relative to the
chunk start, builds the whole mask pair by pair with loops, and takes a plain
softmax (numpy float64 for the layer, float32 jax for gradients). Inputs have
padding and two documents in a row (a boundary inside a block), at lengths
that are and are not multiples of the block. Every path is held to it: the
blocked XLA path (merged, multihead, one component per layer), the splash
kernel and the Pallas block-sparse kernel (interpret mode on CPU), and the
encoder (`models/encoder.SequenceClassifier`) with a merged pattern and with
interleaved layers.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import block_sparse_flash
from longformer_jax.attention.core import splash_kernels as sk
from longformer_jax.attention.sparse_transformer import splash as sparse_splash
from longformer_jax.attention.sparse_transformer.attention import (SparseTransformerAttention,
                                                                   SparseTransformerConfig,
                                                                   sparse_transformer_attention)
from longformer_jax.config.errors import ConfigError
from longformer_jax.models.encoder import SequenceClassifier, encoder_context
from longformer_jax.models.resolved_model import encoder_model_config
from tests.support import splash_mask_reference as splash_masks
from tests.support.dense_mask_reference import (B, D, H, HD, STRIDE, SUMMARY, chunk_facts,
                                                context_for, dense_jax_attention, reference_layer)
from tests.support.gradient_checks import assert_gradients_match
from tests.support.tiny_models import VOCAB, shared_settings, tiny_config

UNIONS = {'strided': ['strided_local', 'strided_summary'],
          'fixed': ['fixed_local', 'fixed_summary']}


def bidirectional_rule(component: str, i: int, j: int, l: int, c: int) -> bool:
  """One (query i, key j) pair of relative positions, Python ints; keys before and after."""
  if component == 'strided_local':       # the l - 1 positions on either side, self included
    return abs(i - j) < l
  if component == 'strided_summary':     # every l-th position, both directions
    return (i - j) % l == 0
  if component == 'fixed_local':         # the query's whole block
    return j // l == i // l
  if component == 'fixed_summary':       # the last c positions of every block, before and after
    return j % l >= l - c
  raise ValueError(component)


def head_components(pattern: str, integration: str, num_heads: int) -> list:
  union = UNIONS.get(pattern, [pattern])
  if integration == 'multihead':
    return [[union[0]]] * (num_heads // 2) + [[union[1]]] * (num_heads - num_heads // 2)
  return [union] * num_heads


def loop_mask(head_rules, positions, segments, valid, l=STRIDE, c=SUMMARY) -> np.ndarray:
  """`[batch, heads, n, n]` bool, one pair at a time: a head allows key j to query i when
  any of its components does, j is real and of i's document."""
  b, n = positions.shape
  allowed = np.zeros((b, len(head_rules), n, n), bool)
  for row in range(b):
    rel = [int(p) for p in positions[row] - positions[row, 0]]
    for h, components in enumerate(head_rules):
      for i in range(n):
        for j in range(n):
          allowed[row, h, i, j] = (bool(valid[row, j]) and segments[row, i] == segments[row, j]
                                   and any(bidirectional_rule(comp, rel[i], rel[j], l, c)
                                           for comp in components))
  return allowed


def pattern_mask(pattern, integration, positions, segments, valid, num_heads=H, l=STRIDE,
                 c=SUMMARY):
  return loop_mask(head_components(pattern, integration, num_heads), positions, segments,
                   valid, l, c)


def test_the_reference_sees_keys_after_the_query():
  """The reference itself: each rule allows keys after the query (not a causal mask)."""
  positions, segments, valid = chunk_facts(13)
  for pattern in ('strided_local', 'strided_summary', 'fixed_local', 'fixed_summary'):
    mask = pattern_mask(pattern, 'merged', positions, segments, valid)
    assert np.triu(mask[0, 0], 1).any() and np.tril(mask[0, 0], -1).any(), pattern


# ---- the layer (XLA blocked path, splash, Pallas block-sparse) vs the float64 reference ----

SLOW = pytest.mark.slow
# Default suite: the unions merged and multihead (whose heads each hold one component alone,
# as interleaved layers do) on XLA, and splash; slow: strided multihead, each component
# alone (interleaved layers: the encoder test below has them), the other kernel cases.
LAYER_CASES = (
    [('strided', 'merged', 13, 'xla'), ('fixed', 'merged', 16, 'xla'),
     ('fixed', 'multihead', 13, 'xla'), ('strided', 'merged', 13, 'splash'),
     pytest.param('strided', 'multihead', 16, 'xla', marks=SLOW)]
    + [pytest.param(component, 'merged', 13, 'xla', marks=SLOW) for component in
       ('strided_local', 'strided_summary', 'fixed_local', 'fixed_summary')]
    + [pytest.param('fixed', 'multihead', 16, 'splash', marks=SLOW),
       pytest.param('fixed', 'merged', 13, 'pallas_gpu', marks=SLOW)])


@pytest.mark.parametrize('pattern,integration,n,backend', LAYER_CASES)
def test_layer_matches_dense_reference(pattern, integration, n, backend):
  module = SparseTransformerAttention(
      config=SparseTransformerConfig(pattern=pattern, stride=STRIDE, summary_len=SUMMARY,
                                     integration=integration),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=False,
                             attention_backend=backend))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, {}, ctx)['params']
  y, _, _ = jax.jit(module.apply)({'params': params}, x, {}, ctx)
  allowed = pattern_mask(pattern, integration, positions, segments, valid)
  expected = reference_layer(params, x, positions, allowed)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('pattern,integration,n', [
    ('strided', 'merged', 13), pytest.param('fixed', 'multihead', 15, marks=SLOW)])
def test_gradients_match_dense_reference(pattern, integration, n):
  positions, segments, valid = chunk_facts(n)
  allowed = pattern_mask(pattern, integration, positions, segments, valid)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))

  def blocked_loss(q, k, v):
    out = sparse_transformer_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                                       jnp.asarray(valid), pattern=pattern, stride=STRIDE,
                                       summary_len=SUMMARY, integration=integration,
                                       causal=False)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent)
  assert_gradients_match(blocked_loss, dense_loss, (q, k, v))


@pytest.mark.parametrize('pattern', [pytest.param('strided', marks=SLOW), 'fixed'])
def test_several_query_steps_per_block_match_dense_reference(pattern):
  """Stride 129: query steps of 43 slots, three per block (the fixed local part's step
  starts, the strided local span past the step), two blocks (the last block's summary
  real in row 0), a document boundary mid-block and padding; outputs and gradients."""
  n, l, c = 258, 129, 5
  positions, segments, valid = chunk_facts(n, boundary=150)
  allowed = pattern_mask(pattern, 'merged', positions, segments, valid, l=l, c=c)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))
  q = q / np.sqrt(HD)

  def blocked(q, k, v):
    return sparse_transformer_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                                        jnp.asarray(valid), pattern=pattern, stride=l,
                                        summary_len=c, causal=False)

  def output_and_gradients(fn):
    out, pullback = jax.vjp(fn, q, k, v)
    return (out,) + pullback(cotangent)

  got = jax.jit(output_and_gradients, static_argnums=0)(blocked)
  want = output_and_gradients(lambda q, k, v: dense_jax_attention(q, k, v, allowed))
  for a, b, what in zip(got, want, ('out', 'dq', 'dk', 'dv')):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5, err_msg=what)


# ---- the kernels' masks: several blocks of the kernel, outputs and gradients ----

def kernel_mask(pattern, integration, heads, chunk) -> np.ndarray:
  """The loop reference on the splash tests' inputs (tests/support/splash_mask_reference.py:
  positions from 1000, three documents in a row, padding, queries with no key)."""
  positions, segments, valid = splash_masks.chunk_facts(chunk)
  return pattern_mask(pattern, integration, positions, segments, valid, num_heads=heads,
                      l=splash_masks.STRIDE, c=splash_masks.SUMMARY)


def sparse_kernel(pattern, integration, kernel):
  return lambda q, k, v, seg, valid: sparse_splash.sparse_transformer_splash(
      q, k, v, seg, valid, pattern=pattern, stride=splash_masks.STRIDE,
      summary_len=splash_masks.SUMMARY, integration=integration, causal=False, kernel=kernel)


@pytest.mark.parametrize('pattern,integration,heads', [
    pytest.param('strided', 'merged', 2, marks=SLOW), ('fixed', 'multihead', 2)])
def test_splash_kernel_matches_dense_reference(pattern, integration, heads):
  """Chunk 300: three splash blocks of 128 (blocks after the diagonal are visited)."""
  chunk = 300
  splash_masks.compare_with_mask(sparse_kernel(pattern, integration, None),
                                 kernel_mask(pattern, integration, heads, chunk), chunk)


def test_pallas_block_sparse_kernel_matches_dense_reference():
  """Blocks of 16 over a chunk of 40: the block tables of the bidirectional rules."""
  chunk = 40
  kernel = functools.partial(block_sparse_flash.block_sparse_attention,
                             tuning=block_sparse_flash.KernelTuning(block_q=16, block_k=16))
  splash_masks.compare_with_mask(sparse_kernel('strided', 'merged', kernel),
                                 kernel_mask('strided', 'merged', 2, chunk), chunk)


@pytest.mark.parametrize('component', ['strided_local', 'strided_summary', 'fixed_local',
                                       'fixed_summary'])
def test_mask_objects_equal_the_rules(component):
  """The splash mask object (as the kernel's mask info reads it) and the rule's in-kernel
  form on jnp arrays equal the loop rule at n = 80."""
  n, l, c = 80, splash_masks.STRIDE, splash_masks.SUMMARY
  rule = sparse_splash.component_rule(component, l, c, causal=False)
  expected = np.array([[bidirectional_rule(component, i, j, l, c) for j in range(n)]
                       for i in range(n)])
  mask = sk.head_mask(n, rule)
  np.testing.assert_array_equal(mask[0:n, 0:n], expected)
  np.testing.assert_array_equal(mask[16:48, 32:80], expected[16:48, 32:80])
  ids = jnp.arange(n, dtype=jnp.int32)
  np.testing.assert_array_equal(rule.allows(ids[:, None], ids[None, :]), expected)
  assert rule != sparse_splash.component_rule(component, l, c)      # the causal kernel's key


def test_backends_for_a_bidirectional_layer():
  """A bidirectional config is accepted; splash and pallas_gpu take the bidirectional layer,
  cuDNN is refused in one line."""
  config = tiny_config(attention='sparse_transformer', causal=False, attention_backend='splash')
  assert not config.model.causal
  section = SparseTransformerConfig(pattern='strided')
  pattern = sparse_splash.kernel_pattern(shared_settings(causal=False), section)
  assert not pattern.causal
  resolve = functools.partial(backends.resolve_backend, pattern=pattern, dtype='bfloat16',
                              head_dim=64)
  assert resolve('splash', platform='cpu') == 'splash'
  assert resolve('auto', platform='tpu') == 'splash'
  assert resolve('pallas_gpu', platform='gpu') == 'pallas_gpu'
  assert resolve('auto', platform='gpu') == 'pallas_gpu'
  with pytest.raises(ConfigError) as error:
    resolve('cudnn', platform='gpu')
  assert error.value.key == 'model.attention_backend' and '\n' not in str(error.value)


# ---- the encoder ----

@pytest.mark.parametrize('section,schedule', [
    pytest.param(dict(pattern='fixed', stride=STRIDE, summary_len=SUMMARY), None, marks=SLOW),
    (dict(stride=STRIDE), 'strided_local,strided_summary')],
    ids=['merged_fixed', 'interleaved_strided'])
def test_sequence_classifier_layers_match_dense_reference(section, schedule):
  """`SequenceClassifier` with `model.causal=False` (as the classification task builds it):
  each layer's attention output equals the reference under its layer's pattern (interleaved:
  local in layer 0, summary in layer 1), padding at the end of row 1 (row 0's last block
  summary is real), and the logits are finite."""
  overrides = dict(attention='sparse_transformer', sparse_transformer=section)
  if schedule:
    overrides['layer_schedule'] = {'sparse_transformer': {'pattern': schedule}}
  cfg = encoder_model_config(tiny_config(**overrides).model, VOCAB, num_classes=3)
  assert not cfg.causal
  n = 16
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (B, n)), jnp.int32)
  input_mask = np.ones((B, n), bool)
  input_mask[1, -4:] = False
  ctx = encoder_context(jnp.asarray(input_mask), jnp.zeros((B, n), bool), deterministic=True)
  model = SequenceClassifier(cfg)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens, ctx)['params']
  (logits, _), captured = jax.jit(functools.partial(
      model.apply, capture_intermediates=True, mutable=['intermediates']))(
          {'params': params}, tokens, ctx)
  assert logits.shape == (B, 3) and np.isfinite(np.asarray(logits)).all()
  positions, segments = np.asarray(ctx.positions), np.asarray(ctx.segment_ids)
  patterns = schedule.split(',') if schedule else [section['pattern']] * 2
  for i, pattern in enumerate(patterns):
    layer = captured['intermediates']['encoder']['blocks'][f'layer_{i}']
    attention_in = layer['attention_norm']['__call__'][0]
    attention_out = layer['attention']['__call__'][0][0]
    allowed = pattern_mask(pattern, 'merged', positions, segments, input_mask)
    expected = reference_layer(params['encoder']['blocks'][f'layer_{i}']['attention'],
                               attention_in, positions, allowed)
    np.testing.assert_allclose(np.asarray(attention_out), expected, rtol=2e-4, atol=2e-5)

"""Sparse Transformer attention (blocked) against a float64 dense-mask reference.

The reference writes each pattern straight from Child et al. (2019), section
4.3, as a Python rule on a (query, key) pair of positions relative to the
chunk start, builds the whole n x n mask with loops, and takes a plain
softmax in numpy float64. Inputs have a document boundary and padding, and
lengths that are and are not multiples of the stride.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from longformer_jax.attention.registry import attention_layer
from longformer_jax.attention.sparse_transformer.attention import (SparseTransformerAttention,
                                                         SparseTransformerConfig,
                                                         sparse_transformer_attention)
from longformer_jax.config.errors import ConfigError
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.config.migration import migrate_flat_model
from tests.support.dense_mask_reference import (B, D, H, HD, START, STRIDE, SUMMARY, chunk_facts,
                                                context_for, dense_jax_attention, reference_layer)
from tests.support.gradient_checks import assert_gradients_match
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.tiny_models import (context_of, shared_settings, stream_batch, tiny_config,
                                       tiny_model_config)


def paper_rule(component: str, i: int, j: int, l: int, c: int) -> bool:
  """Section 4.3 of the paper, on relative positions (strided local: the released code's l)."""
  if component == 'strided_local':
    return max(0, i - l + 1) <= j <= i
  if component == 'strided_summary':
    return j <= i and (i - j) % l == 0
  if component == 'fixed_local':
    return j <= i and j // l == i // l
  if component == 'fixed_summary':
    return j <= i and j % l in range(l - c, l)
  raise ValueError(component)


def components_per_head(pattern: str, integration: str, num_heads: int) -> list:
  union = {'strided': ['strided_local', 'strided_summary'],
           'fixed': ['fixed_local', 'fixed_summary']}.get(pattern, [pattern])
  if integration == 'multihead':
    return [[union[0]]] * (num_heads // 2) + [[union[1]]] * (num_heads - num_heads // 2)
  return [union] * num_heads


def reference_mask(pattern, integration, positions, segments, valid, num_heads=H,
                   l=STRIDE, c=SUMMARY) -> np.ndarray:
  """`[batch, heads, n, n]` bool, one (query, key) pair at a time."""
  b, n = positions.shape
  heads = components_per_head(pattern, integration, num_heads)
  allowed = np.zeros((b, num_heads, n, n), bool)
  for row in range(b):
    rel = positions[row] - positions[row, 0]
    for h in range(num_heads):
      for i in range(n):
        for j in range(n):
          allowed[row, h, i, j] = (valid[row, j] and segments[row, i] == segments[row, j]
                                   and any(paper_rule(comp, rel[i], rel[j], l, c)
                                           for comp in heads[h]))
  return allowed


# Merged unions at a multiple of the stride and not; multihead and single
# components (interleaved layers) not.
CASES = ([(pattern, 'merged', n) for pattern in ('strided', 'fixed') for n in (16, 13)]
         + [(pattern, 'multihead', 13) for pattern in ('strided', 'fixed')]
         + [(component, 'merged', 13) for component in
            ('strided_local', 'strided_summary', 'fixed_local', 'fixed_summary')])


@pytest.mark.parametrize('pattern,integration,n', CASES)
def test_layer_matches_dense_reference(pattern, integration, n):
  module = SparseTransformerAttention(
      config=SparseTransformerConfig(pattern=pattern, stride=STRIDE, summary_len=SUMMARY,
                                     integration=integration),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, {}, ctx)['params']
  y, state, aux = jax.jit(module.apply)({'params': params}, x, {}, ctx)
  assert state == {} and aux == {}
  allowed = reference_mask(pattern, integration, positions, segments, valid)
  expected = reference_layer(params, x, positions, allowed)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('pattern,integration,n', [('strided', 'merged', 13),
                                                   ('fixed', 'multihead', 15)])
def test_gradients_match_dense_reference(pattern, integration, n):
  positions, segments, valid = chunk_facts(n)
  allowed = reference_mask(pattern, integration, positions, segments, valid)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))

  def blocked_loss(q, k, v):
    out = sparse_transformer_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                                       jnp.asarray(valid), pattern=pattern, stride=STRIDE,
                                       summary_len=SUMMARY, integration=integration)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent)
  assert_gradients_match(blocked_loss, dense_loss, (q, k, v))


@pytest.mark.parametrize('causal', [True, False], ids=['causal', 'bidirectional'])
@pytest.mark.parametrize('pattern', ['strided', 'fixed'])
def test_forward_and_backward_never_build_an_n_by_n_array(pattern, causal):
  n, stride = 1024, 32
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  q = jnp.ones((1, n, 1, 8))

  def loss(q, k, v):
    return jnp.sum(sparse_transformer_attention(q, k, v, positions, jnp.zeros_like(positions),
                                                jnp.ones((1, n), bool), pattern=pattern,
                                                stride=stride, causal=causal))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
  # Local keys (strided: two blocks causal, three bidirectional; fixed: one) plus the
  # summary keys (one or c per block).
  local_blocks = (2 if causal else 3) if pattern == 'strided' else 1
  keys_per_query = local_blocks * stride + n // stride
  assert largest <= n * keys_per_query < n * n // 4, largest


def test_interleaved_layers_follow_the_layer_schedule():
  """The schedule of `pattern` gives layer 0 the local and layer 1 the summary component."""
  cfg = tiny_model_config(
      attention='sparse_transformer', sparse_transformer={'stride': STRIDE},
      layer_schedule={'sparse_transformer': {'pattern': 'strided_local,strided_summary'}})
  n = 16
  batch = stream_batch(B, n, seed=1)
  batch['positions'] = batch['positions'] + START
  ctx = context_of(batch)
  model = DecoderLM(cfg)
  states = DecoderLM.init_state(cfg, B)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), batch['inputs'], states, ctx)['params']
  _, captured = jax.jit(functools.partial(model.apply, capture_intermediates=True,
                                          mutable=['intermediates']))(
      {'params': params}, batch['inputs'], states, ctx)
  positions = np.asarray(batch['positions'])
  segments, valid = np.asarray(batch['segment_ids']), np.asarray(batch['input_mask'])
  for i, component in enumerate(['strided_local', 'strided_summary']):
    layer = captured['intermediates']['blocks'][f'layer_{i}']
    attention_in = layer['attention_norm']['__call__'][0]
    attention_out = layer['attention']['__call__'][0][0]
    allowed = reference_mask(component, 'merged', positions, segments, valid, num_heads=2)
    expected = reference_layer(params['blocks'][f'layer_{i}']['attention'], attention_in,
                               positions, allowed)
    np.testing.assert_allclose(np.asarray(attention_out), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('key,section,shared', [
    ('model.sparse_transformer.pattern', dict(pattern='dilated'), {}),
    ('model.sparse_transformer.integration', dict(integration='interleaved'), {}),
    ('model.sparse_transformer.integration', dict(pattern='strided_local',
                                                  integration='multihead'), {}),
    ('model.sparse_transformer.integration', dict(integration='multihead'), dict(num_heads=1)),
    ('model.sparse_transformer.stride', dict(stride=0), {}),
    ('model.sparse_transformer.summary_len', dict(pattern='fixed', stride=4, summary_len=5), {}),
    ('model.sparse_transformer.summary_len', dict(summary_len=0), {}),
    ('model.sparse_transformer.strides', dict(strides=4), {}),
])
def test_bad_settings_name_their_key(key, section, shared):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='sparse_transformer', sparse_transformer=section, **shared)
  assert error.value.key == key


def test_a_bad_scheduled_pattern_names_the_section_key():
  with pytest.raises(ConfigError, match=r'model\.sparse_transformer\.pattern: \'dilated\''):
    tiny_config(attention='sparse_transformer',
                layer_schedule={'sparse_transformer': {'pattern': 'strided_local,dilated'}})


def test_old_flat_names_move_to_the_section():
  flat = dict(attention='sparse_transformer', sparse_pattern='fixed', sparse_stride=8,
              sparse_summary_len=2, sparse_integration='multihead',
              layer_schedule={'sparse_pattern': 'fixed_local,fixed_summary'})
  values, moved = migrate_flat_model(flat)
  assert values == dict(
      attention='sparse_transformer',
      sparse_transformer=dict(pattern='fixed', stride=8, summary_len=2, integration='multihead'),
      layer_schedule={'sparse_transformer': {'pattern': 'fixed_local,fixed_summary'}})
  assert ('sparse_stride', 'sparse_transformer.stride') in moved


def test_config_reading():
  cfg = tiny_model_config(attention='sparse_transformer', sparse_transformer=dict(
      pattern='fixed', stride=4, summary_len=2, integration='multihead'))
  config = attention_layer(cfg, jnp.float32).config
  assert (config.pattern, config.stride, config.summary_len, config.integration) == (
      'fixed', 4, 2, 'multihead')


@pytest.mark.slow
def test_trains_as_a_language_model(tmp_path):
  config = tiny_config(attention='sparse_transformer',
                       sparse_transformer=dict(pattern='fixed', stride=4, summary_len=1))
  config.data.chunk_len = 16
  config.train.update(num_steps=3, log_every=1, checkpoint_every=3)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 3 and np.isfinite(metrics['loss'])
  assert 0 < metrics['grad_norm'] < np.inf and state.memory == ({}, {})   # stateless
  assert all(np.isfinite(np.asarray(leaf)).all()
             for leaf in jax.tree_util.tree_leaves(state.params))


def vectorised_mask(pattern: str, positions, segments, valid, l: int, c: int) -> np.ndarray:
  """`[batch, 1, n, n]` bool: `paper_rule` on all pairs at once (for lengths too long to loop)."""
  rel = positions - positions[:, :1]
  i, j = rel[:, :, None], rel[:, None, :]
  rules = {'strided_local': (j <= i) & (j >= i - l + 1),
           'strided_summary': (j <= i) & ((i - j) % l == 0),
           'fixed_local': (j <= i) & (j // l == i // l),
           'fixed_summary': (j <= i) & (j % l >= l - c)}
  allowed = np.zeros(i.shape[:1] + (i.shape[1], j.shape[2]), bool)
  for component in {'strided': ['strided_local', 'strided_summary'],
                    'fixed': ['fixed_local', 'fixed_summary']}.get(pattern, [pattern]):
    allowed |= rules[component]
  allowed &= valid[:, None, :] & (segments[:, :, None] == segments[:, None, :])
  return allowed[:, None]


@pytest.mark.parametrize('pattern', ['strided', 'fixed', 'fixed_summary'])
def test_scan_over_many_query_steps_matches_dense_mask(pattern):
  """Stride 256: steps of 128 queries, two per block, several summary runs (fixed), a
  document boundary mid-block and padding; outputs and gradients of the dense mask."""
  n, l, c = 1000, 256, 8
  positions, segments, valid = chunk_facts(n, boundary=300)
  allowed = vectorised_mask(pattern, positions, segments, valid, l, c)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))
  q = q / np.sqrt(HD)

  def blocked(q, k, v):
    return sparse_transformer_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                                        jnp.asarray(valid), pattern=pattern, stride=l,
                                        summary_len=c)

  np.testing.assert_allclose(np.asarray(jax.jit(blocked)(q, k, v)),
                             np.asarray(dense_jax_attention(q, k, v, allowed)),
                             rtol=2e-4, atol=2e-5)
  assert_gradients_match(lambda q, k, v: jnp.sum(blocked(q, k, v) * cotangent),
                         lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent),
                         (q, k, v))

"""The Performer layer (`PerformerAttention`): projections, RoPE and features against a
float64 reference, the carried state over chunks, reset, the feature redraw schedule
(fixed in evaluation) and the config section's errors. The attention functions are
tested in tests/attention/test_performer.py, whose references
(tests/support/performer_reference.py) this file reuses.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.performer import attention as performer
from longformer_jax.attention.context import AttentionContext
from longformer_jax.config.errors import ConfigError
from tests.support.performer_reference import (B, BLOCK, D, H, HD, M, chunk_facts, jit,
                                               numpy_rotate, reference_attention, reference_mask)
from tests.support.tiny_models import shared_settings, tiny_config


# --------------------------------------------------------- the layer (module)


def context(positions, segments, valid, reset=None, step=None, deterministic=True):
  return AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                          reset=jnp.zeros((B,), bool) if reset is None else jnp.asarray(reset),
                          valid=jnp.asarray(valid),
                          step=None if step is None else jnp.asarray(step, jnp.int32),
                          deterministic=deterministic)


def make_layer(causal=True, **settings):
  """The layer (`settings`: its other `PerformerConfig` values) and its jitted apply."""
  module = performer.PerformerAttention(
      config=performer.PerformerConfig(num_features=M, block_len=BLOCK, **settings),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=causal))
  return module, jit(functools.partial(module.apply, mutable=['intermediates']))


def layer_run(module_apply, params, x, state, ctx):
  (y, state, aux), captured = module_apply({'params': params}, x, state, ctx)
  assert aux == {}
  return y, state, captured['intermediates']['features'][0]


def layer_params(module, n):
  positions, segments, valid = chunk_facts(n)
  x = jax.random.normal(jax.random.PRNGKey(0), (B, n, D))
  state = performer.empty_state(B, H, M, HD) if module.shared.causal else {}
  return jit(module.init)(jax.random.PRNGKey(1), x, state,
                              context(positions, segments, valid))['params']


@pytest.mark.parametrize('causal', [True, False])
def test_layer_matches_float64_reference(causal):
  """Projections, RoPE at absolute positions, the layer's features, dense masked attention."""
  n = 13
  module, apply = make_layer(causal=causal)
  params = layer_params(module, n)
  positions, segments, valid = chunk_facts(n)
  x = jax.random.normal(jax.random.PRNGKey(2), (B, n, D))
  state = performer.empty_state(B, H, M, HD) if causal else {}
  y, new_state, w = layer_run(apply, params, x, state, context(positions, segments, valid))
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  x64 = np.asarray(x, np.float64)
  project = lambda name: np.einsum('bnd,dhe->bnhe', x64, p[name]['kernel'])  # noqa: E731
  q, k = numpy_rotate(project('query'), positions), numpy_rotate(project('key'), positions)
  out = reference_attention(q, k, project('value'), w,
                            reference_mask(positions, segments, valid, causal))
  expected = np.einsum('bnhe,hed->bnd', out, p['out']['kernel'])
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-5)
  assert isinstance(new_state, performer.PerformerState) == causal


def test_layer_state_over_two_chunks_equals_one_chunk_and_reset_clears_it():
  n_a, n = 12, 21
  module, apply = make_layer()
  params = layer_params(module, n)
  positions, segments, valid = chunk_facts(n, boundaries=(14, 6), padding=(0, 2))
  x = jax.random.normal(jax.random.PRNGKey(3), (B, n, D))
  part = lambda a, s: a[:, s]  # noqa: E731
  a_, b_ = slice(0, n_a), slice(n_a, n)
  ctx = lambda s, **kw: context(*(part(f, s) for f in (positions, segments, valid)), **kw)  # noqa
  state0 = performer.empty_state(B, H, M, HD)
  whole, _, _ = layer_run(apply, params, x, state0, ctx(slice(0, n)))
  y_a, state, _ = layer_run(apply, params, part(x, a_), state0, ctx(a_))
  y_b, _, _ = layer_run(apply, params, part(x, b_), state, ctx(b_))
  np.testing.assert_allclose(np.concatenate([y_a, y_b], 1), whole, rtol=2e-5, atol=2e-6)
  # Row 0 flagged reset at chunk B: as if it had no memory; row 1 keeps its memory.
  reset_b, _, _ = layer_run(apply, params, part(x, b_), state, ctx(b_, reset=[True, False]))
  fresh_b, _, _ = layer_run(apply, params, part(x, b_), state0, ctx(b_))
  np.testing.assert_array_equal(reset_b[0], fresh_b[0])
  np.testing.assert_array_equal(reset_b[1], y_b[1])
  assert not np.allclose(y_b[0], fresh_b[0], atol=1e-4)     # the memory mattered


def test_carry_off_is_stateless_within_the_chunk():
  """carry_state=False: state {}, outputs as the carrying layer's from an empty state."""
  n = 12
  module, apply = make_layer(carry_state=False)
  params = layer_params(module, n)
  positions, segments, valid = chunk_facts(n)
  ctx = context(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(4), (B, n, D))
  y, state, _ = layer_run(apply, params, x, {}, ctx)
  assert state == {}
  y_carry, _, _ = layer_run(make_layer()[1], params, x, performer.empty_state(B, H, M, HD), ctx)
  np.testing.assert_array_equal(y, y_carry)
  assert performer.PerformerAttention.init_state(
      performer.PerformerConfig(carry_state=False), shared_settings(), B) == {}


def test_features_are_redrawn_every_period_and_fixed_in_evaluation():
  n = 8
  module, apply = make_layer(redraw_every=3)
  params = layer_params(module, n)
  positions, segments, valid = chunk_facts(n)
  x = jax.random.normal(jax.random.PRNGKey(5), (B, n, D))
  state0 = performer.empty_state(B, H, M, HD)

  def run(step, deterministic=False, state=state0):
    return layer_run(apply, params, x, state, context(positions, segments, valid, step=step,
                                                      deterministic=deterministic))
  drawn = {step: np.asarray(run(step)[2]) for step in (0, 2, 3, 5, 6)}
  np.testing.assert_array_equal(drawn[0], drawn[2])           # one period: same features
  np.testing.assert_array_equal(drawn[3], drawn[5])
  assert not np.allclose(drawn[0], drawn[3]) and not np.allclose(drawn[3], drawn[6])
  for step in (0, 4, 7):                                       # evaluation: the fixed ones
    np.testing.assert_array_equal(np.asarray(run(step, deterministic=True)[2]), drawn[0])
  # A carry made with the features of period 0 is dropped in period 1, kept within period 0.
  _, carried, _ = run(2)
  np.testing.assert_array_equal(run(3, state=carried)[0], run(3)[0])
  assert not np.allclose(run(2, state=carried)[0], run(2)[0], atol=1e-4)
  # No redraw: the step does not matter.
  module_fixed, apply_fixed = make_layer()
  fixed = lambda step: layer_run(apply_fixed, params, x, state0, context(  # noqa: E731
      positions, segments, valid, step=step, deterministic=False))[2]
  np.testing.assert_array_equal(fixed(0), fixed(100))
  np.testing.assert_array_equal(fixed(0), drawn[0])


# ------------------------------------------------------------------ config


@pytest.mark.parametrize('key,section,rule', [
    ('num_features', dict(num_features=0), '>= 1'),
    ('kernel', dict(kernel='cosine'), 'must be one of'),
    ('feature_norm', dict(feature_norm='unit'), 'must be one of'),
    ('block_len', dict(block_len=0), '>= 1'),
    ('redraw_every', dict(redraw_every=-1), '>= 0'),
    ('seed', dict(seed=-2), '>= 0'),
    ('relu_eps', dict(kernel='relu', relu_eps=0.0), '> 0'),
    ('relu_eps', dict(relu_eps=0.01), "read only by kernel='relu'"),
    ('carry_state', dict(carry_state='sometimes'), 'not a bool'),
    ('num_featurs', dict(num_featurs=4), 'did you mean num_features'),
])
def test_bad_settings_name_key_value_and_rule(key, section, rule):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='performer', performer=section)
  assert error.value.key == f'model.performer.{key}'
  message = str(error.value)
  assert rule in message and '\n' not in message
  if key in performer.PerformerConfig.field_names():
    assert repr(section[key]) in message


def test_good_settings_resolve():
  model = tiny_config(attention='performer', performer=dict(
      kernel='relu', relu_eps=0.01, num_features=8, redraw_every=100, carry_state=False)).model
  assert model.performer.kernel == 'relu' and model.performer.num_features == 8

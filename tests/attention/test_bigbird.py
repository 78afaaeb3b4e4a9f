"""BigBird block-sparse attention against a float64 dense-mask reference.

The reference decides every (query, key) pair with loops from the rule of
Zaheer et al. (2020): window blocks, the layer's random blocks R, global
tokens (first g blocks, plus the first flagged tokens), on positions relative
to the chunk start; softmax in numpy float64 (helpers shared with
test_sparse_transformer.py). Inputs have a document boundary, padding, random
global flags, and lengths that are and are not multiples of the block.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from longformer_jax.attention.bigbird.attention import (BigBirdAttention, BigBirdConfig,
                                                        bigbird_attention, pattern_key,
                                                        random_block_pattern)
from longformer_jax.attention.registry import attention_layer
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.config.migration import migrate_flat_model
from tests.support.dense_mask_reference import (B, D, H, HD, chunk_facts, context_for,
                                                dense_jax_attention, reference_layer)
from tests.support.gradient_checks import assert_gradients_match
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config

BLOCK, WINDOW, RANDOM = 4, 1, 2


def reference_globals(positions, valid, flags, global_blocks, max_flagged) -> np.ndarray:
  """`[batch, n]`: real tokens of the first g blocks, then the first `max_flagged` flagged ones."""
  is_global = np.zeros(positions.shape, bool)
  for row in range(positions.shape[0]):
    flagged = 0
    for t in range(positions.shape[1]):
      if not valid[row, t]:
        continue
      if (positions[row, t] - positions[row, 0]) // BLOCK < global_blocks:
        is_global[row, t] = True
      elif flags[row, t] and flagged < max_flagged:
        is_global[row, t] = True
        flagged += 1
  return is_global


def reference_mask(positions, segments, valid, is_global, pattern, causal) -> np.ndarray:
  """`[batch, 1, n, n]` bool, one (query, key) pair at a time."""
  b, n = positions.shape
  allowed = np.zeros((b, 1, n, n), bool)
  for row in range(b):
    rel = positions[row] - positions[row, 0]
    for i in range(n):
      for j in range(n):
        qb, kb = rel[i] // BLOCK, rel[j] // BLOCK
        sparse = (abs(qb - kb) <= WINDOW or kb in pattern[qb]
                  or is_global[row, i] or is_global[row, j])
        allowed[row, 0, i, j] = (sparse and valid[row, j] and segments[row, i] == segments[row, j]
                                 and (not causal or rel[j] <= rel[i]))
  return allowed


def random_flags(n: int) -> np.ndarray:
  return np.random.default_rng(n).random((B, n)) < 0.25


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('n,global_blocks,max_flagged', [(24, 1, 0), (22, 0, 3)])
def test_layer_matches_dense_reference(n, global_blocks, max_flagged, causal):
  module = BigBirdAttention(
      config=BigBirdConfig(block=BLOCK, window_blocks=WINDOW, random_blocks=RANDOM,
                           global_blocks=global_blocks, max_global_tokens=max_flagged, seed=3),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=causal), layer_index=1)
  positions, segments, valid = chunk_facts(n)
  flags = random_flags(n)
  ctx = context_for(positions, segments, valid).replace(global_flags=jnp.asarray(flags))
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, {}, ctx)['params']
  y, state, aux = jax.jit(module.apply)({'params': params}, x, {}, ctx)
  assert state == {} and aux == {}
  pattern = np.asarray(module.pattern(n))
  is_global = reference_globals(positions, valid, flags, global_blocks, max_flagged)
  allowed = reference_mask(positions, segments, valid, is_global, pattern, causal)
  # The case must exercise random keys that neither window nor globals cover.
  assert (allowed & ~reference_mask(positions, segments, valid, is_global,
                                    np.zeros((pattern.shape[0], 0), int), causal)).any()
  expected = reference_layer(params, x, positions, allowed)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('causal', [False, True])
def test_gradients_match_dense_reference(causal):
  n, global_blocks, max_flagged = 21, 1, 2
  positions, segments, valid = chunk_facts(n)
  flags = random_flags(n)
  pattern = random_block_pattern(pattern_key(5, 0), 6, RANDOM, WINDOW, global_blocks, causal)
  is_global = reference_globals(positions, valid, flags, global_blocks, max_flagged)
  allowed = reference_mask(positions, segments, valid, is_global, np.asarray(pattern), causal)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))

  def blocked_loss(q, k, v):
    out = bigbird_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                            jnp.asarray(valid), jnp.asarray(flags), pattern, block=BLOCK,
                            window_blocks=WINDOW, global_blocks=global_blocks,
                            max_global_tokens=max_flagged, causal=causal)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent)
  assert_gradients_match(blocked_loss, dense_loss, (q, k, v))


@pytest.mark.parametrize('causal', [False, True])
def test_forward_and_backward_never_build_an_n_by_n_array(causal):
  n, block = 1024, 32
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  flags = (positions % 100 == 7)
  pattern = random_block_pattern(pattern_key(0, 0), n // block, 3, 1, 1, causal)
  q = jnp.ones((1, n, 1, 8))

  def loss(q, k, v):
    return jnp.sum(bigbird_attention(q, k, v, positions, jnp.zeros_like(positions),
                                     jnp.ones((1, n), bool), flags, pattern, block=block,
                                     window_blocks=1, global_blocks=1, max_global_tokens=8,
                                     causal=causal))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
  # The concatenated scores: window, random and global keys of every query.
  keys_per_query = (2 + (0 if causal else 1) + 3) * block + block + 8
  assert largest <= n * keys_per_query < n * n // 4, largest


@pytest.mark.parametrize('causal', [False, True])
def test_random_pattern_is_a_function_of_its_key(causal):
  num_blocks, num_random, window, global_blocks = 16, 3, 1, 1
  draw = lambda seed, layer: np.asarray(random_block_pattern(
      pattern_key(seed, layer), num_blocks, num_random, window, global_blocks, causal))
  pattern = draw(0, 2)
  np.testing.assert_array_equal(pattern, draw(0, 2))
  assert (pattern != draw(1, 2)).any() and (pattern != draw(0, 3)).any()
  assert pattern.shape == (num_blocks, num_random)
  for query_block, row in enumerate(pattern):
    assert len(set(row.tolist())) == num_random
    candidates = [j for j in range(global_blocks, num_blocks) if abs(query_block - j) > window
                  and (not causal or j < query_block)]
    # Candidates are drawn first; only blocks short of candidates repeat others.
    assert set(row[:min(num_random, len(candidates))].tolist()) <= set(candidates)


def test_train_and_eval_see_the_same_pattern():
  """No hidden randomness: a training call (dropout rng, not deterministic) equals an eval call."""
  module = BigBirdAttention(
      config=BigBirdConfig(block=BLOCK, window_blocks=WINDOW, random_blocks=RANDOM, seed=7),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=False))
  n = 48
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(0), (B, n, D))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, {}, ctx)
  apply = jax.jit(lambda ctx, rngs: module.apply(params, x, {}, ctx, rngs=rngs)[0])
  evaluated = apply(ctx, {})
  trained = apply(ctx.replace(deterministic=False), {'dropout': jax.random.PRNGKey(9)})
  np.testing.assert_array_equal(np.asarray(trained), np.asarray(evaluated))
  reseeded = module.clone(config=dataclasses.replace(module.config, seed=8))
  assert (np.asarray(reseeded.pattern(n)) != np.asarray(module.pattern(n))).any()


@pytest.mark.parametrize('key,section', [
    ('model.bigbird.block', dict(block=0)),
    ('model.bigbird.window_blocks', dict(window_blocks=-1)),
    ('model.bigbird.random_blocks', dict(random_blocks=1.5)),
    ('model.bigbird.random_blocks', dict(random_blocks=-1)),
    ('model.bigbird.global_blocks', dict(global_blocks=-2)),
    ('model.bigbird.max_global_tokens', dict(max_global_tokens=-1)),
    ('model.bigbird.blocks', dict(blocks=4)),
])
def test_bad_settings_name_their_key(key, section):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='bigbird', bigbird=section)
  assert error.value.key == key


def lm_config(bigbird: dict, **sections) -> dict:
  return dict(model=dict(attention='bigbird', bigbird=bigbird), **sections)


@pytest.mark.parametrize('sections,lengths', [
    (dict(data=dict(chunk_len=64), eval=dict(chunk_len=128)), '64, 128'),
    (dict(data=dict(chunk_len=64), train=dict(num_steps=4, phases=2)), '64, 128'),
])
def test_random_pattern_that_differs_between_chunk_lengths_is_refused(sections, lengths):
  """Random blocks are drawn per number of blocks: training and evaluation would differ."""
  with pytest.raises(ConfigError, match='depends on the chunk length') as error:
    resolve_config(lm_config({'block': 16}, **sections))
  assert error.value.key == 'model.bigbird.random_blocks'
  assert f'({lengths}: ' in str(error.value) and '4, 8 blocks of 16' in str(error.value)


@pytest.mark.parametrize('bigbird,sections', [
    ({'random_blocks': 0}, dict(data=dict(chunk_len=64), eval=dict(chunk_len=128))),
    ({'block': 16}, dict(data=dict(chunk_len=60), eval=dict(chunk_len=64))),   # 4 blocks each
    ({'block': 16}, dict(data=dict(chunk_len=64), eval=dict(chunk_len=64))),
])
def test_chunk_lengths_with_one_random_pattern_are_accepted(bigbird, sections):
  resolve_config(lm_config(bigbird, **sections))
  # The pattern is indeed the same for lengths with the same number of blocks.
  module = BigBirdAttention(config=BigBirdConfig(block=16),
                            shared=shared_settings(num_heads=H, head_dim=HD, d_model=D,
                                                   causal=False))
  np.testing.assert_array_equal(module.pattern(60), module.pattern(64))
  assert module.pattern(64).shape != module.pattern(128).shape


def test_old_flat_names_move_to_the_section():
  flat = dict(attention='bigbird', bigbird_block=8, bigbird_window_blocks=2,
              bigbird_random_blocks=1, bigbird_global_blocks=0, bigbird_max_global_tokens=3,
              bigbird_seed=5)
  values, moved = migrate_flat_model(flat)
  assert values == dict(attention='bigbird', bigbird=dict(
      block=8, window_blocks=2, random_blocks=1, global_blocks=0, max_global_tokens=3, seed=5))
  assert ('bigbird_block', 'bigbird.block') in moved
  with pytest.raises(ConfigError, match=r'model\.bigbird_seed: unknown key; it is now '
                                        r'model\.bigbird\.seed'):
    resolve_config(dict(model=dict(attention='bigbird', bigbird_seed=5)))


def test_config_reading():
  cfg = tiny_model_config(attention='bigbird', causal=False, bigbird=dict(
      block=8, window_blocks=2, random_blocks=1, global_blocks=0, max_global_tokens=3, seed=5))
  module = attention_layer(cfg, jnp.float32)
  config = module.config
  assert (config.block, config.window_blocks, config.random_blocks, config.global_blocks,
          config.max_global_tokens, config.seed, module.shared.causal, module.layer_index) == (
              8, 2, 1, 0, 3, 5, False, 0)


def test_layers_draw_their_own_pattern_in_the_model():
  """The stack gives each layer its index, folded into its key: layers draw different patterns."""
  n = 24
  cfg = tiny_model_config(attention='bigbird', causal=False, bigbird=dict(
      block=BLOCK, window_blocks=WINDOW, random_blocks=RANDOM, global_blocks=0, seed=4))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (B, n)), jnp.int32)
  model = DecoderLM(cfg)
  states = DecoderLM.init_state(cfg, B)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens, states, ctx)['params']
  _, captured = jax.jit(functools.partial(model.apply, capture_intermediates=True,
                                          mutable=['intermediates']))(
      {'params': params}, tokens, states, ctx)
  patterns = [np.asarray(random_block_pattern(pattern_key(4, i), n // BLOCK, RANDOM, WINDOW, 0,
                                              False)) for i in range(2)]
  assert (patterns[0] != patterns[1]).any()
  no_globals = np.zeros((B, n), bool)
  for i, pattern in enumerate(patterns):
    layer = captured['intermediates']['blocks'][f'layer_{i}']
    allowed = reference_mask(positions, segments, valid, no_globals, pattern, causal=False)
    expected = reference_layer(params['blocks'][f'layer_{i}']['attention'],
                               layer['attention_norm']['__call__'][0], positions, allowed)
    np.testing.assert_allclose(np.asarray(layer['attention']['__call__'][0][0]), expected,
                               rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_trains_as_a_causal_language_model(tmp_path):
  config = tiny_config(attention='bigbird', causal=True,
                       bigbird=dict(block=4, random_blocks=1, global_blocks=1))
  config.data.chunk_len = 16
  config.train.update(num_steps=3, log_every=1, checkpoint_every=3)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 3 and np.isfinite(metrics['loss'])
  assert 0 < metrics['grad_norm'] < np.inf and state.memory == ({}, {})   # stateless
  assert all(np.isfinite(np.asarray(leaf)).all()
             for leaf in jax.tree_util.tree_leaves(state.params))


@pytest.mark.parametrize('causal', [False, True])
def test_scan_over_many_query_blocks_matches_dense_mask(causal):
  """Blocks of 32 over 700 tokens (22 scan steps): window, 3 random blocks, globals (ITC and
  flagged), a document boundary and padding; outputs and gradients of the dense mask."""
  n, block, window, num_random, global_blocks, max_flagged = 700, 32, 1, 3, 1, 4
  positions, segments, valid = chunk_facts(n, boundary=250)
  flags = random_flags(n)
  num_blocks = -(-n // block)
  pattern = np.asarray(random_block_pattern(pattern_key(2, 0), num_blocks, num_random, window,
                                            global_blocks, causal))
  is_global = np.zeros((B, n), bool)
  for row in range(B):      # the ITC blocks, then the first flagged real tokens
    is_global[row] = valid[row] & (np.arange(n) // block < global_blocks)
    flagged = np.flatnonzero(flags[row] & valid[row] & ~is_global[row])[:max_flagged]
    is_global[row, flagged] = True
  qb = np.arange(n)[:, None] // block
  kb = np.arange(n)[None, :] // block
  random_pair = np.zeros((num_blocks, num_blocks), bool)
  random_pair[np.arange(num_blocks)[:, None], pattern] = True
  sparse = (np.abs(qb - kb) <= window) | random_pair[qb, kb]
  sparse = sparse[None] | is_global[:, :, None] | is_global[:, None, :]
  allowed = sparse & valid[:, None, :] & (segments[:, :, None] == segments[:, None, :])
  if causal:
    allowed &= np.arange(n)[None, :] <= np.arange(n)[:, None]
  allowed = allowed[:, None]
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))
  q = q / np.sqrt(HD)

  def blocked(q, k, v):
    return bigbird_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                             jnp.asarray(valid), jnp.asarray(flags), jnp.asarray(pattern),
                             block=block, window_blocks=window, global_blocks=global_blocks,
                             max_global_tokens=max_flagged, causal=causal)

  np.testing.assert_allclose(np.asarray(jax.jit(blocked)(q, k, v)),
                             np.asarray(dense_jax_attention(q, k, v, allowed)),
                             rtol=2e-4, atol=2e-5)
  assert_gradients_match(lambda q, k, v: jnp.sum(blocked(q, k, v) * cotangent),
                         lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent),
                         (q, k, v))

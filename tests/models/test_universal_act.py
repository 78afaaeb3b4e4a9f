"""Universal Transformer ACT against one block application and a per-position Python reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.positional import sinusoid_embedding
from longformer_jax.models.pre_ln_block import DecoderBlock
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.universal_stack import UniversalTransformerACT
from tests.support.tiny_models import (context_of, random_normal, stream_batch, tiny_config,
                                       tiny_model_config)

B, C = 2, 8


def _config(max_steps):
  return tiny_model_config(attention='vanilla', mem_len=0, stack='universal_act',
                           universal_act={'max_steps': max_steps, 'epsilon': 0.01})


def _run(config, seed=0, halting_bias=None):
  x = random_normal(1, (B, C, config.d_model))
  ctx = context_of(stream_batch(B, C))
  stack = UniversalTransformerACT(config)
  states = UniversalTransformerACT.init_state(config, B)
  params = stack.init(jax.random.PRNGKey(seed), x, states, ctx)['params']
  if halting_bias is not None:
    params = jax.tree_util.tree_map(lambda a: a, params)
    params['halting']['bias'] = nn.meta.replace_boxed(params['halting']['bias'],
                                                      jnp.full((1,), halting_bias))
  y, _, aux = stack.apply({'params': params}, x, states, ctx)
  return x, ctx, params, y, aux


def _empty(config):
  return UniversalTransformerACT.init_state(config, B)[0]


def test_one_step_equals_one_block_application():
  config = _config(1)
  x, ctx, params, y, aux = _run(config)
  block_input = x + sinusoid_embedding(jnp.zeros((), jnp.int32), config.d_model)
  expected, _ = DecoderBlock(config).apply({'params': params['shared_block']}, block_input, _empty(config), ctx)
  np.testing.assert_allclose(np.asarray(y), np.asarray(expected), atol=1e-5)
  # One step and remainder 1 for every position: rho = N + R = 2.
  np.testing.assert_allclose(float(aux[0]['ponder_loss']), 2.0, rtol=1e-6)


def _sigmoid(v):
  return 1.0 / (1.0 + np.exp(-v))


def reference_act(config, params, x, ctx, max_steps, threshold):
  """Graves' ACT bookkeeping per position in plain Python; the block runs via flax."""
  signal = np.asarray(sinusoid_embedding(jnp.arange(max_steps), config.d_model))
  w = np.asarray(nn.meta.unbox(params['halting']['kernel']))[:, 0]
  b = float(nn.meta.unbox(params['halting']['bias'])[0])
  state = np.asarray(x, np.float64)
  halted = np.zeros(x.shape[:2], bool)
  cumulative = np.zeros(x.shape[:2])
  ponder = np.zeros(x.shape[:2])
  for step in range(max_steps):
    s = state + signal[step]
    transformed, _ = DecoderBlock(config).apply({'params': params['shared_block']},
                                                jnp.asarray(s, jnp.float32), _empty(config), ctx)
    transformed = np.asarray(transformed, np.float64)
    for i in range(x.shape[0]):
      for j in range(x.shape[1]):
        if halted[i, j]:
          continue                                  # copied unchanged
        p = _sigmoid(s[i, j] @ w + b)
        ponder[i, j] += 1                           # N(t) counts this step
        if step == max_steps - 1 or cumulative[i, j] + p > threshold:
          weight = 1.0 - cumulative[i, j]           # the remainder R(t)
          ponder[i, j] += weight
          halted[i, j] = True
        else:
          weight = p
          cumulative[i, j] += p
        state[i, j] = weight * transformed[i, j] + (1 - weight) * state[i, j]
  return state, ponder.mean()


def test_act_matches_python_reference():
  config = _config(4)
  # A bias that makes p ~ 0.3-0.5: positions halt after 2-4 steps, at different steps.
  x, ctx, params, y, aux = _run(config, seed=3, halting_bias=-0.5)
  expected, ponder = reference_act(config, params, x, ctx, 4, 0.99)
  np.testing.assert_allclose(np.asarray(y), expected, atol=2e-5)
  np.testing.assert_allclose(float(aux[0]['ponder_loss']), ponder, rtol=1e-5)
  assert 1.0 < float(aux[0]['act_steps']) < 4.0     # positions really halt at different steps


def test_universal_act_model_trains(tmp_path):
  from train import train
  config = tiny_config(attention='vanilla', mem_len=0, stack='universal_act',
                       universal_act={'max_steps': 3, 'epsilon': 0.01})
  config.model.aux_loss_weights.ponder_loss = 0.01
  config.train.update(num_steps=2, checkpoint_every=2)
  _, metrics = train(config, str(tmp_path))
  assert np.isfinite(metrics['loss']) and 0 < metrics['grad_norm'] < np.inf
  # Positions take 1..3 steps; the ponder cost N + R lies in (steps, steps + 1].
  steps, ponder = metrics['aux/act_steps'], metrics['aux/ponder_loss']
  assert 1.0 <= steps <= 3.0 and steps < ponder <= steps + 1.0
  # The weighted ponder cost enters the objective (the loss itself excludes it).
  np.testing.assert_allclose(metrics['objective'], metrics['loss'] + 0.01 * ponder, rtol=1e-5)


@pytest.mark.parametrize('settings,key', [
    ({'max_steps': 0}, 'max_steps'), ({'epsilon': 1.5}, 'epsilon'), ({'epsilon': 0.0}, 'epsilon')])
def test_bad_act_settings_name_the_key(settings, key):
  with pytest.raises(ConfigError, match=rf'model\.universal_act\.{key}: '):
    tiny_config(stack='universal_act', universal_act=settings)


@pytest.mark.parametrize('shared,key', [
    ({'scan_layers': True}, 'scan_layers'), ({'remat_policy': 'full'}, 'remat_policy'),
    ({'layer_schedule': {'mem_len': '8,16'}}, 'layer_schedule')])
def test_shared_settings_the_loop_ignores_are_errors(shared, key):
  """One block config is applied at every step: per-layer settings would be ignored."""
  with pytest.raises(ConfigError, match=rf'model\.{key}: '):
    tiny_config(stack='universal_act', **shared)


def test_old_flat_names_migrate_to_the_section():
  values, moved = migrate_flat_model({'stack': 'universal_act', 'act_max_steps': 6,
                                      'act_epsilon': 0.05})
  assert values == {'stack': 'universal_act', 'universal_act': {'max_steps': 6, 'epsilon': 0.05}}
  assert sorted(moved) == [('act_epsilon', 'universal_act.epsilon'),
                           ('act_max_steps', 'universal_act.max_steps')]

"""GTrXL gating (Parisotto et al., 2019) against plain residuals and a numpy reference."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.gating import Gate
from longformer_jax.memory import fifo
from longformer_jax.models.gtrxl_block import GatedBlock, GTrXLConfig
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.pre_ln_block import DecoderBlock
from tests.support.tiny_models import (context_of, random_normal, stream_batch, tiny_config,
                                       tiny_model_config)

B, C = 2, 8


def _block_inputs(config):
  x = random_normal(1, (B, C, config.d_model))
  state = fifo.create(B, config.mem_len, (config.d_model,))
  return x, state, context_of(stream_batch(B, C))


def _gated_config(**gtrxl):
  return tiny_model_config(block='gtrxl', gtrxl=gtrxl)


def test_output_gate_saturated_open_equals_the_plain_residual_block():
  config = _gated_config(gate='output', gate_bias=-1e4, relu=False)
  x, state, ctx = _block_inputs(config)
  gated = GatedBlock(config)
  params = gated.init(jax.random.PRNGKey(0), x, state, ctx)['params']
  y_gated, (state_gated, _) = gated.apply({'params': params}, x, state, ctx)
  plain_params = {k: params[k] for k in ('attention', 'attention_norm', 'feed_forward',
                                         'feed_forward_norm')}
  y_plain, (state_plain, _) = DecoderBlock(config).apply({'params': plain_params}, x, state, ctx)
  np.testing.assert_allclose(np.asarray(y_gated), np.asarray(y_plain), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(state_gated.values), np.asarray(state_plain.values))


def _sigmoid(v):
  return 1.0 / (1.0 + np.exp(-v))


def test_gru_gate_matches_numpy_reference():
  x, y = random_normal(2, (B, C, 16)), random_normal(3, (B, C, 16))
  gate = Gate('gru', bias=0.7)
  params = gate.init(jax.random.PRNGKey(4), x, y)['params']
  got = gate.apply({'params': params}, x, y)
  p = {k: np.asarray(nn.meta.unbox(v)['kernel'], np.float64) for k, v in params.items()}
  xn, yn = np.asarray(x, np.float64), np.asarray(y, np.float64)
  r = _sigmoid(yn @ p['w_r'] + xn @ p['u_r'])
  z = _sigmoid(yn @ p['w_z'] + xn @ p['u_z'] - 0.7)
  h = np.tanh(yn @ p['w_g'] + (r * xn) @ p['u_g'])
  np.testing.assert_allclose(np.asarray(got), (1 - z) * xn + z * h, atol=1e-5)


@pytest.mark.parametrize('kind', ['gru', 'output', 'highway'])
def test_large_gate_bias_starts_the_block_at_the_identity(kind):
  """b_g large: the GRU update gate and the output gate close, highway carries x."""
  config = _gated_config(gate=kind, gate_bias=30.0)
  x, state, ctx = _block_inputs(config)
  block = GatedBlock(config)
  params = block.init(jax.random.PRNGKey(0), x, state, ctx)['params']
  y, _ = block.apply({'params': params}, x, state, ctx)
  np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-5)


@pytest.mark.slow  # a train.py smoke run; the layer tests cover the variant
def test_gtrxl_model_trains(tmp_path):
  from train import train
  config = tiny_config(block='gtrxl')
  config.train.update(num_steps=2, checkpoint_every=2)
  state, metrics = train(config, str(tmp_path))
  assert int(state.step) == 2 and np.isfinite(metrics['loss'])
  assert 0 < metrics['grad_norm'] < np.inf            # the gates pass gradients
  layer = state.params['blocks']['layer_0']
  assert {'attention_gate', 'feed_forward_gate'} <= set(layer)
  assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree_util.tree_leaves(layer))
  # The XL memory carried from step to step holds the last mem_len tokens of every row.
  assert all(np.asarray(memory.valid).all() for memory in state.memory)


@pytest.mark.parametrize('settings,key', [({'gate': 'lstm'}, 'gate'),
                                          ({'gate_bias': float('nan')}, 'gate_bias'),
                                          ({'gate_bias': float('inf')}, 'gate_bias')])
def test_bad_gate_settings_name_the_key(settings, key):
  with pytest.raises(ConfigError, match=rf'model\.gtrxl\.{key}: '):
    tiny_config(block='gtrxl', gtrxl=settings)


def test_gate_settings_of_an_unused_block_are_an_error():
  with pytest.raises(ConfigError, match=r"model\.gtrxl\.gate: 'output' is ignored"):
    tiny_config(block='pre_ln', gtrxl={'gate': 'output'})


def test_old_flat_names_migrate_to_the_section():
  values, moved = migrate_flat_model({'block': 'gtrxl', 'gtrxl_gate': 'highway',
                                      'gtrxl_gate_bias': 1.0, 'gtrxl_relu': False})
  assert values == {'block': 'gtrxl',
                    'gtrxl': {'gate': 'highway', 'gate_bias': 1.0, 'relu': False}}
  assert sorted(moved) == [('gtrxl_gate', 'gtrxl.gate'), ('gtrxl_gate_bias', 'gtrxl.gate_bias'),
                           ('gtrxl_relu', 'gtrxl.relu')]
  assert GatedBlock.Config is GTrXLConfig

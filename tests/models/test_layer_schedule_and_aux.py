"""Per-layer config schedules, per-layer memories, and auxiliary losses in the objective."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention import registry
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import validate_config
from longformer_jax.models.decoder_lm import DecoderLM, state_logical_axes
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.resolved_model import resolved_model
from longformer_jax.train.lm_objective import lm_sums, weighted_aux_losses
from tests.support.tiny_models import stream_batch, tiny_config, tiny_model_config


def test_layer_config_resolves_each_layer_with_the_default_type():
  config = tiny_config(num_layers=3, layer_schedule={
      'mem_len': '4, 8,16', 'attention': ('vanilla', 'xl', 'xl'),
      'xl': {'clamp_len': '2,4,8'}})               # a section key: typed like its field
  model = resolved_model(config.model)
  got = [(layer_config(model, i).mem_len, layer_config(model, i).attention,
          layer_config(model, i).xl.clamp_len) for i in range(3)]
  assert got == [(4, 'vanilla', 2), (8, 'xl', 4), (16, 'xl', 8)]
  assert isinstance(got[0][0], int) and isinstance(got[0][2], int)
  layer = layer_config(model, 1)
  assert layer.layer_schedule == {} and layer.layer_index == 1
  with pytest.raises(TypeError, match='takes a ResolvedModel'):
    layer_config(config.model, 1)   # a dict config: resolve it first


@pytest.mark.parametrize('schedule, message', [
    (dict(mem_len='4,8,16'), r'model\.layer_schedule\.mem_len: .* needs one value per layer'),
    (dict(mem_len='4,x'), r"model\.layer_schedule\.mem_len: 'x' is not an int"),
    (dict(attention='xl,nope'), r"model\.attention: 'nope' is not a variant"),
    (dict(xl={'clamp_len': '2,x'}), r"model\.layer_schedule\.xl\.clamp_len: 'x' is not an int"),
    (dict(xl={'clamp_len': '0,4'}), r'model\.xl\.clamp_len: 0 must be -1 \(off\) or > 0'),
    (dict(xl={'clamp_lem': '2,4'}), r'model\.layer_schedule\.xl\.clamp_lem: unknown key; '
                                    r'did you mean clamp_len\?'),
    (dict(window='2,4'), r'model\.layer_schedule\.window: unknown key'),   # not a shared key
    (dict(xl='2,4'), r'model\.layer_schedule\.xl: .*schedule the keys of the section'),
    (dict(d_model='32,64'), r'model\.layer_schedule\.d_model: .*the same for every layer'),
])
def test_bad_schedules_name_the_key(schedule, message):
  config = tiny_config()
  config.model.layer_schedule.update(schedule)
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_schedule_with_scanned_layers_is_rejected():
  config = tiny_config(scan_layers=True)
  config.model.layer_schedule.mem_len = '4,8'
  with pytest.raises(ConfigError, match='model.scan_layers'):
    validate_config(config)


def test_layers_get_their_own_memories_and_logical_axes():
  config = tiny_model_config()
  config = dataclasses.replace(config, layer_schedule={'attention': 'vanilla,xl', 'mem_len': '0,12'})
  states = DecoderLM.init_state(config, batch_size=4)
  assert isinstance(states, tuple) and len(states) == 2
  assert states[0].values.shape == (4, 0, 32) and states[1].values.shape == (4, 12, 32)
  axes = state_logical_axes(states)
  assert axes[1].values == ('batch', 'memory', 'embed')
  assert axes[1].valid == ('batch', 'memory')
  batch = stream_batch(4, 16)
  params = DecoderLM(config).init(jax.random.PRNGKey(0), batch['inputs'][:, :8], states,
                                  _ctx(batch, 8))['params']
  # The vanilla layer has no relative-position parameters, the XL layer does.
  assert 'relative_key' not in params['blocks']['layer_0']['attention']
  assert 'relative_key' in params['blocks']['layer_1']['attention']
  memory, sums = lm_sums(DecoderLM(config), params, states, batch, chunk_len=8)
  assert np.asarray(memory[1].valid).all() and np.isfinite(float(sums['loss_sum']))


def _ctx(batch, length):
  from tests.support.tiny_models import context_of
  return context_of({k: v[:, :length] for k, v in batch.items()})


def test_weighted_aux_losses_reference():
  aux = ({'span_loss': 2.0, 'occupancy': 0.5}, {'span_loss': 3.0, 'occupancy': 1.5}, {})
  objective, stats = weighted_aux_losses(aux, {'span_loss': 0.1})
  np.testing.assert_allclose(float(objective), 0.1 * (2.0 + 3.0), rtol=1e-6)
  np.testing.assert_allclose(float(stats['aux/span_loss']), 5.0)
  np.testing.assert_allclose(float(stats['aux/occupancy']), 1.0)
  with pytest.raises(ConfigError, match='model.aux_loss_weights.span_loss'):
    weighted_aux_losses(aux, {})


class _PenalisedVanilla(nn.Module):
  """Vanilla attention that reports the mean square of its output as a loss."""
  shared: SharedSettings
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config, shared, batch_size, dtype=jnp.float32):
    return registry.ATTENTION_VARIANTS['vanilla'].init_state(config, shared, batch_size, dtype)

  @nn.compact
  def __call__(self, x, state, ctx):
    inner = registry.ATTENTION_VARIANTS['vanilla'](shared=self.shared, dtype=self.dtype,
                                                   name='inner')
    y, state, _ = inner(x, state, ctx)
    return y, state, {'square_loss': jnp.mean(jnp.square(y.astype(jnp.float32))), 'seen': 1.0}


def test_aux_losses_enter_the_objective_token_weighted(monkeypatch):
  monkeypatch.setitem(registry.ATTENTION_VARIANTS, 'penalised', _PenalisedVanilla)
  config = tiny_model_config(attention='penalised', mem_len=0)
  assert config.penalised.to_dict() == {}    # no `Config` on the class: an empty section
  config = dataclasses.replace(config, aux_loss_weights={'square_loss': 0.5})
  model = DecoderLM(config)
  batch = stream_batch(2, 16)
  states = DecoderLM.init_state(config, 2)
  params = model.init(jax.random.PRNGKey(0), batch['inputs'][:, :8], states, _ctx(batch, 8))['params']
  _, sums = lm_sums(model, params, states, batch, chunk_len=8)
  # Independently: run each chunk, add 0.5 * (sum over layers of the loss) * tokens.
  expected_extra = 0.0
  for c in range(2):
    chunk = {k: v[:, c * 8:(c + 1) * 8] for k, v in batch.items()}
    _, states, aux = model.apply({'params': params}, chunk['inputs'], states, _ctx(chunk, 8))
    expected_extra += 0.5 * sum(float(a['square_loss']) for a in aux) * 16
  np.testing.assert_allclose(float(sums['objective_sum'] - sums['loss_sum']), expected_extra, rtol=1e-5)
  assert float(sums['chunks']) == 2 and float(sums['aux/seen']) == 2

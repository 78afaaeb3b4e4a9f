"""models/resolved_model.py (and resolved_model_type.py): the typed, frozen, hashable model
the Flax modules take."""

import dataclasses
import pickle

import ml_collections
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.models import model_config, model_settings, resolved_model_type
from longformer_jax.models import resolved_model as builders
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.model_config import ModelConfig, resolve_model
from longformer_jax.models.resolved_model import (ResolvedModel, encoder_model_config,
                                                  lm_model_config, resolved_model)

SCHEDULED = dict(attention='longformer', layer_schedule={
    'attention': 'longformer,xl,longformer,longformer',
    'longformer': {'window': '16,32,64,128'}})


def test_the_resolved_model_is_the_section_plus_what_is_derived():
  values = resolve_model(SCHEDULED)
  model = lm_model_config(ml_collections.ConfigDict(values), 259)
  assert isinstance(model, ResolvedModel) and isinstance(model, ModelConfig)
  assert model.vocab_size == 320 and model.layer_index == 0     # 259 padded to 64s
  assert model.longformer.window == values['longformer']['window']
  assert model.longformer is model.sections['longformer']
  assert model.model_values() == values                         # config.model, unchanged
  assert resolved_model(model.to_dict()) == model
  assert hash(model) == hash(lm_model_config(values, 259))
  assert pickle.loads(pickle.dumps(model)) == model
  with pytest.raises(dataclasses.FrozenInstanceError):
    model.d_model = 8
  with pytest.raises(AttributeError, match="no setting or section 'window'"):
    model.window   # pylint: disable=pointless-statement
  assert not encoder_model_config(values, 259).causal


def test_each_layer_gets_its_scheduled_values_typed_like_their_fields():
  model = resolved_model(resolve_model(SCHEDULED))
  layers = [layer_config(model, i) for i in range(4)]
  assert [layer.attention for layer in layers] == ['longformer', 'xl', 'longformer', 'longformer']
  assert [layer.longformer.window for layer in layers] == [16, 32, 64, 128]
  assert [layer.layer_index for layer in layers] == [0, 1, 2, 3]
  assert all(layer.layer_schedule == {} and hash(layer) for layer in layers)
  assert model.longformer.window == 256                         # the model itself unchanged


def test_nothing_falls_back_to_a_default():
  values = resolve_model({})
  with pytest.raises(ConfigError, match=r'model\.xl\.relative_impl: missing'):
    resolved_model(values, xl={'clamp_len': 3})                 # a partial section
  with pytest.raises(ConfigError, match=r'model\.xl: missing'):
    resolved_model({k: v for k, v in values.items() if k != 'xl'})
  with pytest.raises(ConfigError, match=r'model\.mem_len: missing'):
    resolved_model({k: v for k, v in values.items() if k != 'mem_len'})
  with pytest.raises(ConfigError, match=r'model\.windw: unknown key'):
    resolved_model(values, windw=3)
  assert resolved_model(values, xl=dict(values['xl'], clamp_len=3)).xl.clamp_len == 3


@pytest.mark.parametrize('values, message', [
    ({'block': 'nope'}, r"model\.block: 'nope' is not a block kind; choose one of \['gtrxl'"),
    ({'stack': 'nope'}, r"model\.stack: 'nope' is not a stack kind; choose one of "
                        r"\['attendre_delay'"),
])
def test_an_unknown_block_or_stack_names_its_key(values, message):
  # `ModelConfig` (models/model_settings.py) imports no registry of the model floor, so
  # `resolve_model` checks these two names against the block and stack registries.
  with pytest.raises(ConfigError, match=message):
    resolve_model(values)


def test_the_type_stands_below_the_registries():
  # The model floor's modules name `ResolvedModel` in their annotations: its module and
  # `ModelConfig`'s import no block, stack or registry (no import circle, type-only
  # imports included: tests/test_import_graph.py), and the builders re-export them.
  assert builders.ResolvedModel is resolved_model_type.ResolvedModel
  assert model_config.ModelConfig is model_settings.ModelConfig
  assert issubclass(ResolvedModel, model_settings.ModelConfig)

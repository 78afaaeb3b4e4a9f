"""`config/frozen_mapping.py`: a section's dict-typed field is held immutable and hashable."""

import copy
import json
import pickle

import pytest

from longformer_jax.config.frozen_mapping import FrozenMapping, freeze, thaw
from longformer_jax.models.model_config import ModelConfig, resolve_model


def test_a_frozen_mapping_reads_like_the_dict_it_was_made_from():
  values = {'attention': 'xl,vanilla', 'longformer': {'window': ['16', '32']}}
  frozen = freeze(values)
  assert isinstance(frozen, FrozenMapping) and isinstance(frozen['longformer'], FrozenMapping)
  assert frozen == values and values == frozen
  assert frozen.get('attention') == 'xl,vanilla' and dict(frozen)['attention'] == 'xl,vanilla'
  assert thaw(frozen) == values and type(thaw(frozen)['longformer']['window']) is list
  assert frozen != {'attention': 'xl,vanilla', 'longformer': {'window': ('16', '32')}}
  assert hash(frozen) == hash(freeze(json.loads(json.dumps(values))))
  assert copy.deepcopy(frozen) == frozen and pickle.loads(pickle.dumps(frozen)) == frozen
  with pytest.raises((AttributeError, TypeError)):
    frozen['attention'] = 'vanilla'


def test_sections_with_dict_fields_hash_and_write_plain_dicts():
  model = ModelConfig.build({'aux_loss_weights': {'span_loss': 0.5},
                             'rope_scaling': {'type': 'linear', 'factor': 2.0}}, 'model')
  assert isinstance(model.aux_loss_weights, FrozenMapping)
  assert hash(model) == hash(ModelConfig.build(model.to_dict(), 'model'))
  assert hash(ModelConfig()) == hash(ModelConfig())
  written = model.to_dict()
  assert type(written['aux_loss_weights']) is dict and json.loads(json.dumps(written)) == written
  resolved = resolve_model({'aux_loss_weights': {'span_loss': 0.5}})
  assert type(resolved['layer_schedule']) is dict

"""`config.json` of runs made before the config sections existed still load.

The fixtures under tests/data/old_run_configs/ are the flat configs that
train.py wrote for five experiments before `config.model` had one section
per variant.
"""

import json
import pathlib

import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.saved_config import migrate_saved_config

OLD = pathlib.Path(__file__).resolve().parents[1] / 'data' / 'old_run_configs'


def load(name: str) -> dict:
  return json.loads((OLD / f'{name}.json').read_text())


@pytest.mark.parametrize('name', sorted(p.stem for p in OLD.glob('*.json')))
def test_old_config_loads_with_its_settings(name):
  old = load(name)
  values, changes = migrate_saved_config(old)
  resolved = resolve_config(values)
  model = resolved['model']
  assert model['attention'] == old['model']['attention']
  for key in ('num_layers', 'd_model', 'num_heads', 'head_dim', 'd_ff', 'causal'):
    assert model[key] == old['model'].get(key, model[key])
  for old_key, new in changes:
    assert old_key.startswith('model.') and (new.startswith('model.') or new.startswith('dropped'))


def test_moved_keys_keep_their_values():
  values, changes = migrate_saved_config(load('longformer_lm'))
  model = resolve_config(values)['model']
  assert model['longformer']['window'] == 32
  assert model['layer_schedule'] == {'longformer': {'window': '16,32,64,128', 'head_dilations': [
      '1,1,1,1', '1,1,1,1', '1,1,1,1', '1,1,2,2']}}
  assert ('model.window', 'model.longformer.window') in changes
  assert ('model.mem_len', 'dropped (the attention keeps no cache)') in changes

  model = resolve_config(migrate_saved_config(load('attendre'))[0])['model']
  assert model['attendre']['memory_size'] == 256


def test_a_key_that_no_longer_exists_is_named():
  old = load('default')
  old['model']['relative_positions'] = 'sinusoid'
  with pytest.raises(ConfigError, match='config.model.relative_positions: unknown key'):
    resolve_config(migrate_saved_config(old)[0])


def test_new_configs_are_left_alone():
  values = {'model': {'attention': 'xl', 'mem_len': 64, 'xl': {'clamp_len': 8}}}
  assert migrate_saved_config(values) == (values, [])

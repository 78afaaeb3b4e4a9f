"""The experiment config: every bad value names its key, its value and the rule, in one line."""

import ml_collections
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.lra.pathfinder import PathfinderConfig
from longformer_jax.experiment_config import parse_int_list, resolve_config, validate_config
from longformer_jax.parallel.mesh import resolve_mesh_shape
from tests.support.tiny_models import tiny_config


def test_default_config_is_valid():
  validate_config(tiny_config(), device_count=8)


def test_empty_config_takes_every_default():
  resolved = resolve_config({})
  assert resolved['task'] == 'lm' and resolved['model']['attention'] == 'vanilla'
  assert resolved['data']['chunk_len'] == 256 and resolved['train']['num_steps'] == 900
  assert set(resolved['model']) >= {'xl', 'longformer', 'lsh', 'gtrxl', 'universal_act'}


@pytest.mark.parametrize('shape,devices,expected', [
    ((-1, 1, 1), 8, (8, 1, 1)), ((2, -1, 2), 8, (2, 2, 2)), ((1, 1, 1), 1, (1, 1, 1))])
def test_mesh_shape_fills_minus_one(shape, devices, expected):
  assert resolve_mesh_shape(shape, devices) == expected


@pytest.mark.parametrize('shape', [(3, 1, 1), (-1, -1, 1), (2, 2), (0, 1, 8), (-1, 3, 1)])
def test_bad_mesh_shape_names_the_key(shape):
  with pytest.raises(ConfigError, match='parallel.mesh_shape'):
    resolve_mesh_shape(shape, 8)
    resolve_config({'parallel': {'mesh_shape': shape}})


@pytest.mark.parametrize('section,name,value,rule', [
    ('model', 'attention', 'longformerish', 'choose one of'),
    ('model', 'dtype', 'float16', 'must be one of'),
    ('model', 'head_dim', 7, 'must be even'),
    ('model', 'mem_len', -1, 'must be >= 0'),
    ('model', 'dropout_rate', 1.0, 'in \\[0, 1\\)'),
    ('model', 'remat_policy', 'all', 'not a remat policy'),
    ('data', 'chunk_len', 0, 'positive'),
    ('data', 'tokenizer', 'wordpiece', 'must be one of'),
    ('eval', 'split', 'train', "'valid' or 'test'"),
    ('eval', 'mem_lens', '0,x', 'comma-separated'),
    ('eval', 'far_distance', -1, '>= 0'),
    ('train', 'num_steps', 0, 'positive'),
    ('train', 'stop_after_steps', -3, '>= 0'),
    ('train', 'phase_steps', '300,300', 'adding up'),
    ('optimizer', 'b2', 1.0, 'in \\[0, 1\\)'),
    ('parallel', 'logical_axis_rules', (('batch', 'pipeline'),), 'mesh axes'),
])
def test_bad_values_name_key_value_and_rule(section, name, value, rule):
  config = tiny_config()
  config[section][name] = value
  with pytest.raises(ConfigError, match=f'^config.{section}.{name}: ') as error:
    validate_config(config)
  assert repr(value) in str(error.value) and '\n' not in str(error.value)
  assert error.match(rule)


def test_command_line_strings_parse_by_the_field_type():
  resolved = resolve_config({'model': {'num_layers': '3', 'causal': 'false', 'dropout_rate': '0.1'},
                             'parallel': {'mesh_shape': '(1, -1, 1)'}})
  assert resolved['model']['num_layers'] == 3 and resolved['model']['causal'] is False
  assert resolved['model']['dropout_rate'] == 0.1
  assert resolved['parallel']['mesh_shape'] == (1, -1, 1)


def test_wrong_types_are_named():
  with pytest.raises(ConfigError, match=r"config.train.num_steps: 'many' is not an int"):
    resolve_config({'train': {'num_steps': 'many'}})
  with pytest.raises(ConfigError, match='config.model.causal: 3 is not a bool'):
    resolve_config({'model': {'causal': 3}})


def test_a_value_where_a_section_belongs_is_named():
  # `--config.data.listops=3` sets the section itself: a short error, not a traceback.
  with pytest.raises(ConfigError, match=r"config.model.xl: is a section of keys, not a value "
                                        r"\(got '4'\)"):
    resolve_config({'model': {'attention': 'xl', 'xl': '4'}})


def test_a_section_is_read_from_a_mapping_or_a_config_dict():
  # The data builders read a resolved config's sections, which are ConfigDicts.
  built = PathfinderConfig.build({'dashes_per_path': 2}, 'data.pathfinder')
  assert PathfinderConfig.build(ml_collections.ConfigDict(built.to_dict()),
                                'data.pathfinder') == built


@pytest.mark.parametrize('values,message', [
    ({'trian': {}}, 'config.trian: unknown key; did you mean train?'),
    ({'train': {'num_step': 3}}, 'config.train.num_step: unknown key; did you mean num_steps?'),
    ({'model': {'attention': 'xl', 'xl': {'clamp_lem': 4}}},
     'config.model.xl.clamp_lem: unknown key; did you mean clamp_len?'),
    ({'model': {'d_modle': 64}}, 'config.model.d_modle: unknown key; did you mean d_model?'),
])
def test_unknown_keys_name_the_closest_valid_one(values, message):
  with pytest.raises(ConfigError) as error:
    resolve_config(values)
  assert str(error.value) == message


def test_settings_nobody_reads_are_errors():
  with pytest.raises(ConfigError, match="config.model.xl.clamp_len: 8 is ignored"):
    resolve_config({'model': {'attention': 'vanilla', 'xl': {'clamp_len': 8}}})
  with pytest.raises(ConfigError, match='config.data.question_len: 16 is ignored: only task qa'):
    resolve_config({'data': {'question_len': 16}})
  with pytest.raises(ConfigError, match="config.train.phases: 2 is ignored by task 'qa'"):
    resolve_config({'task': 'qa', 'train': {'phases': 2, 'num_steps': 10}})
  with pytest.raises(ConfigError, match="config.model.num_classes: 3 is ignored by task 'lm'"):
    resolve_config({'model': {'num_classes': 3}})
  # The defaults of a section nobody uses are fine, also when written out in full.
  resolve_config(resolve_config({'model': {'attention': 'vanilla'}}))


def test_task_settings_are_required_where_read():
  with pytest.raises(ConfigError, match="config.model.num_classes: 0 must be >= 2"):
    resolve_config({'task': 'classification'})
  with pytest.raises(ConfigError, match='config.optimizer.grad_accum_steps: 3 must divide'):
    resolve_config({'optimizer': {'grad_accum_steps': 3}})


def test_validate_config_completes_the_config_in_place():
  config = tiny_config()
  del config.model['xl']
  returned = validate_config(config)
  assert returned is config and config.model.xl.clamp_len == -1


def test_parse_int_list():
  assert parse_int_list('0, 128,512', 'k') == [0, 128, 512]
  assert parse_int_list('', 'k') == [] and parse_int_list(64, 'k') == [64]
  with pytest.raises(ConfigError, match='config.k:'):
    parse_int_list('1,two', 'k')

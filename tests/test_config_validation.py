"""Config checks name the offending key."""

import pytest

from longformer_jax.config_errors import ConfigError
from longformer_jax.config_validation import parse_int_list, validate_config
from longformer_jax.parallel.mesh import resolve_mesh_shape
from tests.tiny_models import tiny_config


def test_default_config_is_valid():
  validate_config(tiny_config(), device_count=8)


@pytest.mark.parametrize('shape,devices,expected', [
    ((-1, 1, 1), 8, (8, 1, 1)), ((2, -1, 2), 8, (2, 2, 2)), ((1, 1, 1), 1, (1, 1, 1))])
def test_mesh_shape_fills_minus_one(shape, devices, expected):
  assert resolve_mesh_shape(shape, devices) == expected


@pytest.mark.parametrize('shape', [(3, 1, 1), (-1, -1, 1), (2, 2), (0, 1, 8), (-1, 3, 1)])
def test_bad_mesh_shape_names_the_key(shape):
  with pytest.raises(ConfigError, match="'parallel.mesh_shape'"):
    resolve_mesh_shape(shape, 8)


@pytest.mark.parametrize('section,name,value', [
    ('model', 'attention', 'longformerish'), ('model', 'dtype', 'float16'),
    ('model', 'head_dim', 7), ('model', 'mem_len', -1), ('model', 'dropout_rate', 1.0),
    ('data', 'chunk_len', 0), ('eval', 'split', 'train'), ('eval', 'mem_lens', '0,x'),
    ('eval', 'far_distance', -1),
    ('train', 'num_steps', 0)])
def test_bad_values_name_their_key(section, name, value):
  config = tiny_config()
  config[section][name] = value
  with pytest.raises(ConfigError, match=f"'{section}.{name}'"):
    validate_config(config)


def test_parse_int_list():
  assert parse_int_list('0, 128,512', 'k') == [0, 128, 512]
  assert parse_int_list('', 'k') == [] and parse_int_list(64, 'k') == [64]

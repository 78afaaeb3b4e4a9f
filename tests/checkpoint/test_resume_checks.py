"""Tests of `longformer_jax.checkpoint.resume_checks`: resuming with other settings."""

import json

import jax
import jax.numpy as jnp
import pytest

from longformer_jax.checkpoint import resume_checks
from longformer_jax.checkpoint.resume_checks import check_resumable
from longformer_jax.checkpoint.resume_checks import config_differences
from longformer_jax.checkpoint.resume_checks import shape_differences
from longformer_jax.config.errors import ConfigError


def _config(**sections) -> dict:
  config = {
      'seed': 0,
      'data': {'corpus': 'stdlib', 'batch_size': 8, 'chunk_len': 256,
               'tokenizer': 'byte', 'sentencepiece_model': '',
               'eval_batch_size': 8},
      'model': {'attention': 'xl', 'd_model': 256, 'dropout_rate': 0.0,
                'longformer': {'window': 64, 'dilation': (1, 2)}},
      'optimizer': {'learning_rate': 2e-3, 'grad_accum_steps': 1},
      'train': {'num_steps': 900},
  }
  for section, values in sections.items():
    config[section] = (dict(config[section], **values)
                       if isinstance(values, dict) else values)
  return config


def test_same_settings_and_other_schedules_do_not_differ():
  saved = json.loads(json.dumps(_config()))  # Tuples become lists.
  current = _config(train={'num_steps': 5000}, optimizer={'learning_rate': 1.0},
                    data={'corpus': 'pg19', 'eval_batch_size': 2}, seed=None)
  assert config_differences(saved, current) == []


def test_shape_settings_differ():
  current = _config(model={'d_model': 512, 'longformer': {'window': 64,
                                                          'dilation': (1, 4)}},
                    data={'batch_size': 16, 'tokenizer': 'sentencepiece'},
                    optimizer={'grad_accum_steps': 2})
  assert config_differences(_config(), current) == [
      'data.batch_size', 'data.tokenizer', 'model.d_model',
      'model.longformer.dilation', 'optimizer.grad_accum_steps']


def test_keys_missing_on_one_side_are_ignored():
  saved = _config()
  del saved['model']['dropout_rate']
  current = _config(model={'dropout_rate': 0.1, 'new_setting': 3})
  assert config_differences(saved, current) == []


def test_check_resumable_names_saved_and_new_values(tmp_path):
  (tmp_path / 'config.json').write_text(json.dumps(_config()))
  check_resumable(str(tmp_path), _config(train={'num_steps': 1}))
  current = _config(model={'d_model': 512, 'attention': 'longformer'},
                    data={'batch_size': 4, 'chunk_len': 128})
  with pytest.raises(ConfigError) as raised:
    check_resumable(str(tmp_path), current)
  message = str(raised.value)
  assert raised.value.key == 'data.batch_size'
  assert 'data.batch_size: saved 8, now 4' in message
  assert 'data.chunk_len: saved 256, now 128' in message
  assert 'model.attention: saved "xl", now "longformer"' in message
  assert 'and 1 more' in message and 'model.d_model' not in message
  assert 'new --workdir' in message and str(tmp_path / 'config.json') in message
  assert '\n' not in message


def test_check_resumable_without_config_json_and_with_migration(tmp_path):
  check_resumable(str(tmp_path), _config())  # A new workdir: nothing to check.
  old = _config()
  old['model'] = {'attention': 'xl', 'd_model': 256, 'window': 64}
  (tmp_path / 'config.json').write_text(json.dumps(old))

  def migrate(saved):
    saved['model']['longformer'] = {'window': saved['model'].pop('window')}
    return saved

  current = _config(model={'longformer': {'window': 32}})
  check_resumable(str(tmp_path), current)  # Flat key: compared with nothing.
  with pytest.raises(ConfigError, match='model.longformer.window: saved 64'):
    check_resumable(str(tmp_path), current, migrate=migrate)


def test_shape_differences_match_metadata_paths_to_the_state():
  target = {'params': {'w': jax.ShapeDtypeStruct((4, 3), jnp.float32),
                       'b': jax.ShapeDtypeStruct((3,), jnp.float32)},
            'rng': jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
            'layers': [jax.ShapeDtypeStruct((2,), jnp.int32)],
            'empty': None}
  saved = {'params': {'w': jax.ShapeDtypeStruct((4, 3), jnp.bfloat16),
                      'b': jax.ShapeDtypeStruct((5,), jnp.float32),
                      'old': jax.ShapeDtypeStruct((1,), jnp.float32)},
           'rng': jax.ShapeDtypeStruct((2,), jnp.uint32),
           'layers': [jax.ShapeDtypeStruct((2,), jnp.int32)],
           'empty': None}
  assert shape_differences(saved, target) == [
      'params/b: saved (5,), now (3,)',
      'params/old: saved (1,), not in this run']
  assert shape_differences(target, target) == []


def test_orbax_mismatch_summary_is_one_line():
  error = ValueError('User-provided restore item and on-disk value metadata '
                     'tree structures do not match:\nparams.extra:\n\nmore')
  summary = resume_checks.orbax_mismatch_summary(error)
  assert 'do not match: params.extra: more' in summary and '\n' not in summary
  assert resume_checks.orbax_mismatch_summary(ValueError('NOT_FOUND')) is None
  assert resume_checks.orbax_mismatch_summary(
      RuntimeError('tree structures do not match')) is None

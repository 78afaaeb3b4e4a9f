"""The ahead-of-time memory check compiles a config's train step without running it."""

import os
import subprocess
import sys

import ml_collections
import pytest

import memory_check
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import validate_config
from tests.support.repo_paths import REPO_ROOT

TINY_CONFIG = """
def get_config():
  return {'model': {'attention': 'vanilla', 'num_layers': 1, 'd_model': 32, 'num_heads': 2,
                    'head_dim': 16, 'd_ff': 64, 'mem_len': 0},
          'data': {'batch_size': 8, 'chunk_len': 16, 'chunks_per_step': 1, 'eval_batch_size': 8},
          'train': {'num_steps': 10}}
"""


def tiny_config(batch_size: int, mesh_shape=(2, 1, 1, 4)) -> ml_collections.ConfigDict:
  values = {'model': {'attention': 'vanilla', 'num_layers': 1, 'd_model': 32, 'num_heads': 2,
                      'head_dim': 16, 'd_ff': 64, 'mem_len': 0},
            'data': {'batch_size': batch_size, 'chunk_len': 16, 'chunks_per_step': 1,
                     'eval_batch_size': 8},
            'train': {'num_steps': 10}, 'parallel': {'mesh_shape': mesh_shape}}
  return validate_config(ml_collections.ConfigDict(values))


@pytest.fixture(scope='module')
def reports():
  """Per-device memory of the train step at batch 8 and 16 on a data 2 x sequence 4 mesh."""
  return {batch: memory_check.train_step_memory(tiny_config(batch)) for batch in (8, 16)}


def test_bytes_are_positive_and_grow_with_the_batch(reports):
  small, large = reports[8][0], reports[16][0]
  for report in (small, large):
    assert report.argument > 0 and report.output > 0 and report.temp > 0
    assert report.generated_code >= 0 and 0 < report.total
  assert large.argument > small.argument and large.temp > small.temp


def test_report_names_the_mesh_and_every_field(reports):
  text = memory_check.format_report(tiny_config(8), 8, reports[8])
  assert 'data 2 x fsdp 1 x tensor 1 x sequence 4' in text
  for name in memory_check.FIELDS:
    assert name in text


@pytest.mark.parametrize('overrides,key', [
    ({'parallel': {'mesh_shape': (2, 1, 1, 3)}}, 'parallel.mesh_shape'),
    ({'data': {'chunk_len': 12}}, 'parallel.load_balance'),          # 12 % (2 x 4) != 0
    ({'data': {'batch_size': 7}}, 'data.batch_size'),
])
def test_bad_mesh_names_the_key(overrides, key):
  config = tiny_config(8)
  for section, values in overrides.items():
    for name, value in values.items():
      config[section][name] = value
  with pytest.raises(ConfigError, match=f'^config.{key}: '):
    memory_check.check_mesh(config, 8)


def test_command_line_error_is_one_line(tmp_path):
  config_file = tmp_path / 'tiny.py'
  config_file.write_text(TINY_CONFIG)
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  result = subprocess.run(
      [sys.executable, 'memory_check.py', f'--config={config_file}',
       '--config.parallel.mesh_shape=(2,1,1,3)'],
      capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120, check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      'error: config.parallel.mesh_shape: (2, 1, 1, 3) has 6 devices but 8 are available (cpu)']


def test_a_given_vocabulary_size_replaces_the_tokenizer():
  """`vocab_size` (`--vocab_size`) sizes the embedding without loading a tokenizer: a
  SentencePiece config whose model file is not on this machine still builds its step."""
  values = tiny_config(8, (8, 1, 1)).to_dict()
  values['data'].update(tokenizer='sentencepiece', sentencepiece_model='/nonexistent/spm.model')
  config = validate_config(ml_collections.ConfigDict(values))
  _, (phase,) = memory_check.phase_steps(config, vocab_size=1000)
  multiple = config.model.vocab_multiple          # the model pads the vocabulary up to it
  assert phase.state.params['embedding']['embedding'].shape == (-(-1000 // multiple) * multiple,
                                                                32)
  with pytest.raises(ConfigError, match='--vocab_size'):
    memory_check.phase_steps(config, vocab_size=-1)

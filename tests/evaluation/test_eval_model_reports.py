"""eval.py's reports: the model named from its layers, no stale files, refused overrides."""

import json

import ml_collections
import pytest

import eval as eval_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.evaluation import report_files
from longformer_jax import command_line
from longformer_jax.evaluation.architecture_overrides import (architecture_overrides, given_settings,
                                                              unread_overrides)
from longformer_jax.evaluation.model_description import describe_model
from tests.support.tiny_models import tiny_config


def test_a_memorizing_layer_among_xl_layers_is_named():
  config = tiny_config(attention='xl', num_layers=4, mem_len=16)
  config.model.layer_schedule = {'attention': 'xl,xl,memorizing,xl'}
  config.model.memorizing.memory_size = 512
  assert describe_model(config.model) == (
      'memorizing (memory 512) in layer 2, xl (mem_len 16) elsewhere')


def test_attendre_is_described_by_its_memory_size_and_policy():
  config = tiny_config(attention='attendre')
  config.model.attendre.update(memory_size=128, policy='lra_max')
  assert describe_model(config.model) == 'attendre attention (memory 128, lra_max)'


def test_a_plain_model_is_its_variant():
  assert describe_model(tiny_config(attention='vanilla', mem_len=0).model) == 'vanilla attention'
  assert describe_model(tiny_config(attention='xl').model) == 'xl attention (mem_len 16)'


def test_architecture_overrides_names_only_changed_architecture_keys():
  saved = {'model': {'attention': 'xl', 'mem_len': 16, 'longformer': {'window': 8}},
           'data': {'tokenizer': 'byte', 'batch_size': 8}, 'eval': {'mem_lens': ''}}
  given = {'model': {'mem_len': 16, 'longformer': {'window': 4}},
           'data': {'tokenizer': 'sentencepiece', 'batch_size': 2}, 'eval': {'mem_lens': '0,8'}}
  assert architecture_overrides(given, saved) == ['data.tokenizer', 'model.longformer.window']
  assert architecture_overrides({'model': {'dims': (1, 2)}}, {'model': {'dims': [1, 2]}}) == []
  assert architecture_overrides({'eval': {'step': 3}}, saved) == []


def test_a_setting_newer_than_the_run_counts_only_when_given_one_by_one():
  saved = {'model': {'attention': 'lsh', 'lsh': {'num_hashes': 4}}}
  whole_file = {'model': {'attention': 'lsh', 'lsh': {'num_hashes': 4},
                          'bp_transformer': {'dense_max_len': 256}}}
  assert architecture_overrides(whole_file, saved, explicit={}) == []
  assert architecture_overrides(whole_file, saved, explicit={
      'model': {'bp_transformer': {'dense_max_len': 0}}}) == ['model.bp_transformer.dense_max_len']
  assert architecture_overrides(whole_file, saved) == ['model.bp_transformer.dense_max_len']
  changed = {'model': {'attention': 'lsh', 'lsh': {'num_hashes': 2}}}
  assert architecture_overrides(changed, saved, explicit={}) == ['model.lsh.num_hashes']


def test_unread_overrides_are_those_outside_eval_and_parallel_that_differ():
  saved = {'model': {'mem_len': 16}, 'train': {'num_steps': 9}, 'data': {'batch_size': 8}}
  given = {'model': {'mem_len': 32}, 'train': {'num_steps': 5}, 'data': {'batch_size': 8},
           'eval': {'batch_size': 4}, 'parallel': {'mesh_shape': [1, 1, 1]}}
  assert unread_overrides(given, saved) == ['train.num_steps']


def test_given_settings_are_the_leaves_overrides_changed():
  baseline = {'model': {'mem_len': 16, 'xl': {'clamp_len': 0}}, 'eval': {'step': -1}}
  full = {'model': {'mem_len': 32, 'xl': {'clamp_len': 0}}, 'eval': {'step': 5}}
  assert given_settings(full, baseline) == {'model': {'mem_len': 32}, 'eval': {'step': 5}}


def test_fresh_output_dir_removes_only_eval_outputs(tmp_path):
  out = tmp_path / 'eval'
  out.mkdir()
  for name in ('bits_per_byte_vs_mem_len.png', 'memory_sweep.md', 'notes.txt', 'passkey_grid.json',
               'passkey_grid_attendre_lfa_128.png', 'passkey_grid_notes.txt'):
    (out / name).write_text('old')
  with report_files.fresh_output_dir(str(tmp_path)) as out_dir:
    assert out_dir == str(out)
  assert sorted(p.name for p in out.iterdir()) == ['notes.txt', 'passkey_grid_notes.txt']


def test_eval_refuses_a_model_override_naming_it(tmp_path, monkeypatch):
  config = tiny_config(attention='xl')
  (tmp_path / 'config.json').write_text(config.to_json_best_effort())
  changed = ml_collections.ConfigDict(config.to_dict())
  changed.model.num_layers = 3

  class Flags:
    config = 'configs/default.py'

    def __getitem__(self, name):
      return type('Flag', (), {'present': True})()

  monkeypatch.setattr(eval_script.flags, 'FLAGS', Flags())
  with pytest.raises(ConfigError, match='model.num_layers') as error:
    eval_script.check_overrides_apply(changed, str(tmp_path))
  assert error.value.key == 'model.num_layers'
  eval_script.check_overrides_apply(config, str(tmp_path))   # unchanged: accepted


def test_eval_reads_a_run_saved_before_a_setting_existed(tmp_path, monkeypatch):
  """A run whose config.json lacks a model setting added since (it trained as the
  default does) is evaluated with the whole --config file given; the setting given
  one by one is still refused."""
  path = 'configs/bp_transformer.py'
  config = command_line.experiment_config(path, [])
  saved = config.to_dict()
  del saved['model']['bp_transformer']['dense_max_len']
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  flags = command_line_flags(present=True)
  flags.config = path
  monkeypatch.setattr(eval_script.flags, 'FLAGS', flags)
  eval_script.check_overrides_apply(config, str(tmp_path))
  given = command_line.experiment_config(path, [('model.bp_transformer.dense_max_len', '0')])
  with pytest.raises(ConfigError) as error:
    eval_script.check_overrides_apply(given, str(tmp_path))
  assert error.value.key == 'model.bp_transformer.dense_max_len'


def command_line_flags(present: bool):
  class Flags:
    config = 'configs/default.py'

    def __getitem__(self, name):
      return type('Flag', (), {'present': present})()
  return Flags()


def test_eval_refuses_an_override_it_would_not_read_and_applies_eval_batch_size(
    tmp_path, monkeypatch):
  saved = command_line.experiment_config('configs/default.py', [])
  (tmp_path / 'config.json').write_text(saved.to_json_best_effort())
  monkeypatch.setattr(eval_script.flags, 'FLAGS', command_line_flags(present=False))
  ignored = command_line.experiment_config('configs/default.py', [('train.num_steps', '5')])
  with pytest.raises(ConfigError, match='train.num_steps') as error:
    eval_script.check_overrides_apply(ignored, str(tmp_path))
  assert error.value.key == 'train.num_steps'
  rows = command_line.experiment_config('configs/default.py', [('eval.batch_size', '3')])
  eval_script.check_overrides_apply(rows, str(tmp_path))        # an eval setting: accepted
  assert eval_script.training_config(rows, str(tmp_path)).data.eval_batch_size == 3
  assert eval_script.training_config(saved, str(tmp_path)).data.eval_batch_size == 8

"""What an imported checkpoint cannot do, each refused in one line naming the culprit
(docs/import.md, "Not supported yet"): the settings the family importers do not implement,
the tasks a checkpoint kind does not serve, generate.py's key/value cache on a windowed
import and generation from a seq2seq run, scanned layers on an imported workdir; and what an
eval-time memory does to a windowed import's layers (it replaces every one of them)."""

import json
import os

import ml_collections
import pytest

from longformer_jax.checkpoint.resume_checks import check_resumable
from longformer_jax.config.errors import ConfigError, UserError
from longformer_jax.convert import hf_init, loader
from longformer_jax.convert.errors import ConversionError
from longformer_jax.convert.workdir_cli import convert_to_workdir
from longformer_jax.evaluation import memory_sweep
from longformer_jax.generation.context import exact_decoding
from longformer_jax.generation.generation_checks import refusal
from longformer_jax.generation.kv_cache import kv_cache_model_config
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.resolved_model import lm_model_config
from tests.support.hf_checkpoints import conversion_error, edited_copy

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'hf')


@pytest.mark.parametrize('name, edit, culprit', [
    ('gpt2', {'activation_function': 'relu'}, 'activation_function'),
    ('gpt2', {'scale_attn_by_inverse_layer_idx': True}, 'scale_attn_by_inverse_layer_idx'),
    ('gpt2', {'scale_attn_weights': False}, 'scale_attn_weights'),
    ('llama', {'hidden_act': 'gelu'}, 'hidden_act'),
    ('llama', {'pretraining_tp': 2}, 'pretraining_tp'),
    ('longformer', {'hidden_act': 'relu'}, 'hidden_act'),
])
def test_settings_the_importers_do_not_implement_are_named(name, edit, culprit, tmp_path):
  message = conversion_error(edited_copy(os.path.join(DATA, name), tmp_path,
                                         edit_config=lambda c: c.update(edit)))
  assert f'config.json: {culprit}=' in message and 'is not supported' in message, message


def test_a_decoder_imports_for_the_language_model_only(tmp_path):
  with pytest.raises(ConversionError, match="'llama' checkpoint is a decoder; it imports for "
                     'task lm'):
    convert_to_workdir(os.path.join(DATA, 'llama'), str(tmp_path / 'out'), task='classification')
  config = ml_collections.ConfigDict({'task': 'lm', 'train': {'init_from_hf': DATA}})
  with pytest.raises(ConfigError, match='a decoder is imported as a workdir'):
    hf_init.imported(config)
  config = ml_collections.ConfigDict({'task': 'classification',
                                      'train': {'init_from_hf': os.path.join(DATA, 'llama')}})
  with pytest.raises(ConfigError, match="'llama' checkpoints fine-tune for task lm"):
    hf_init.imported(config)


def test_a_seq2seq_run_does_not_generate_text():
  found = refusal(ml_collections.ConfigDict({'task': 'seq2seq'}))
  assert found[0] == 'task' and 'next-token head' in found[1]


def imported_model(name: str) -> tuple:
  """`(config.model, vocabulary size)` of the import of fixture `name`."""
  hf_config, settings = loader.model_settings(os.path.join(DATA, name))
  return ml_collections.ConfigDict(loader.checkpoint_model_values(
      settings, hf_config, 'float32', None)), hf_config['vocab_size']


@pytest.mark.parametrize('name', ['mistral_window', 'qwen2_window'])
def test_a_windowed_import_refuses_the_key_value_cache(name):
  model, vocab = imported_model(name)
  with pytest.raises(UserError, match=r"--kv_cache: model.attention=.*all 'vanilla'"):
    kv_cache_model_config(model, vocab, 8)
  kv_cache, chunk_len, _ = exact_decoding(model, 64)
  assert kv_cache == 0 and chunk_len == 64          # the chunk-window decoder instead


@pytest.mark.parametrize('name', ['mistral_window', 'qwen2_window'])
def test_an_eval_time_memory_replaces_every_layer_window_included(name):
  model, vocab = imported_model(name)
  layers = lambda resolved: [layer_config(resolved, i).attention for i in range(model.num_layers)]
  assert 'streaming_sinks' in layers(lm_model_config(model, vocab))
  point = memory_sweep.SweepPoint('attendre', 'fifo', 16, 0, 8)
  swept = lm_model_config(model, vocab, **memory_sweep.model_overrides(point, model))
  assert layers(swept) == ['attendre'] * model.num_layers


def test_an_imported_workdir_does_not_resume_with_scanned_layers(tmp_path):
  workdir = str(tmp_path / 'run')
  convert_to_workdir(os.path.join(DATA, 'llama'), workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  assert config['model']['scan_layers'] is False
  config['model']['scan_layers'] = True
  with pytest.raises(ConfigError, match='other shape-changing settings') as error:
    check_resumable(workdir, config)
  assert error.value.key == 'model.scan_layers'

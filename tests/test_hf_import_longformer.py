"""Importing a Hugging Face Longformer (longformer_jax/convert/longformer.py) as `MaskedLM`.

The reference is transformers' own float32 `LongformerForMaskedLM` on a tiny
random model (`tests/data/hf/longformer/`, written by tools/make_hf_fixtures.py):
two layers with total windows 4 and 8 (one-sided 2 and 4), global tokens 0
and 5 in row 0 and 0 in row 1, row 1 right-padded from position 8, perturbed
biases and norm scales. Only valid positions are compared.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from longformer_jax.convert import hf
from longformer_jax.convert.errors import ConversionError
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.masked_lm import MaskedLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, 'tests', 'data', 'hf', 'longformer')


def fixture(file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, file))


@pytest.fixture(scope='module')
def imported():
  model_config, params = hf.load(DATA)
  return model_config, jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)


def masked_lm_logits(model_config, params, global_flags) -> np.ndarray:
  ctx = encoder_context(jnp.asarray(fixture('attention_mask.npy'), bool),
                        jnp.asarray(global_flags, bool), deterministic=True)
  logits, _ = MaskedLM(model_config).apply({'params': params},
                                           jnp.asarray(fixture('input_ids.npy')), ctx)
  return np.asarray(logits)


def max_error(logits: np.ndarray) -> tuple[float, float]:
  """(largest |ours - reference| over valid positions, largest |reference| there)."""
  reference = fixture('logits.npy')
  valid = fixture('attention_mask.npy').astype(bool)
  assert logits.shape == reference.shape
  return np.abs(logits[valid] - reference[valid]).max(), np.abs(reference[valid]).max()


def test_logits_match_transformers_with_padding_and_global_tokens(imported):
  model_config, params = imported
  error, scale = max_error(masked_lm_logits(model_config, params,
                                            fixture('global_attention_mask.npy')))
  assert error <= 1e-4 * scale


def test_the_reference_depends_on_global_tokens_and_per_layer_windows(imported):
  """The fixture is sensitive to what the import must get right: without the global
  tokens, or with layer 0's window in both layers, the logits move far past 1e-4."""
  model_config, params = imported
  globals_ = fixture('global_attention_mask.npy')
  error, scale = max_error(masked_lm_logits(model_config, params, np.zeros_like(globals_)))
  assert error > 1e-2 * scale
  one_window = ml_collections.FrozenConfigDict(dict(model_config.to_dict(), layer_schedule={}))
  error, scale = max_error(masked_lm_logits(one_window, params, globals_))
  assert error > 1e-3 * scale


def test_settings_follow_the_checkpoint(imported):
  model_config, _ = imported
  assert model_config.longformer.window == 2            # attention_window 4 -> 2 per side
  assert model_config.layer_schedule.longformer.window == '2,4'
  assert model_config.block == 'post_ln' and not model_config.causal
  assert model_config.position_embedding == 'learned'
  assert model_config.max_positions == 40 - 1 - 1       # rows after pad_token_id + 1
  assert model_config.ff_activation == 'gelu_exact' and model_config.embedding_norm


def test_load_model_returns_the_masked_lm():
  model, params = hf.load_model(DATA)
  assert isinstance(model, MaskedLM)
  assert set(params) == {'embedding', 'position_embedding', 'embedding_norm', 'encoder',
                         'lm_head_dense', 'lm_head_norm', 'lm_head_bias'}


def edited_copy(tmp_path, edit_tensors=None, edit_config=None) -> str:
  tensors = load_file(os.path.join(DATA, 'model.safetensors'))
  with open(os.path.join(DATA, 'config.json')) as f:
    config = json.load(f)
  if edit_tensors:
    edit_tensors(tensors)
  if edit_config:
    edit_config(config)
  save_file(tensors, str(tmp_path / 'model.safetensors'))
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(config, f)
  return str(tmp_path)


def error_of(hf_dir: str) -> str:
  with pytest.raises(ConversionError) as info:
    hf.load(hf_dir)
  assert '\n' not in str(info.value)
  return str(info.value)


@pytest.mark.parametrize('window, words', [
    ([4, 7], 'even integer'), ([4], 'one window per layer')])
def test_bad_attention_window_is_named(tmp_path, window, words):
  message = error_of(edited_copy(tmp_path, edit_config=lambda c: c.update(attention_window=window)))
  assert 'attention_window' in message and words in message


def test_global_projection_missing_is_named(tmp_path):
  name = 'longformer.encoder.layer.1.attention.self.key_global.weight'
  assert name in error_of(edited_copy(tmp_path, edit_tensors=lambda t: t.pop(name)))


def test_untied_decoder_copy_is_refused(tmp_path):
  def add_untied(tensors):
    table = tensors['longformer.embeddings.word_embeddings.weight']
    tensors['lm_head.decoder.weight'] = table + 1.0
  assert 'lm_head.decoder.weight' in error_of(edited_copy(tmp_path, edit_tensors=add_untied))


def test_tied_decoder_copy_is_accepted(tmp_path):
  def add_tied(tensors):
    tensors['lm_head.decoder.weight'] = tensors['longformer.embeddings.word_embeddings.weight']
    tensors['lm_head.decoder.bias'] = tensors['lm_head.bias']
  hf.load(edited_copy(tmp_path, edit_tensors=add_tied))


def test_command_line_refuses_an_encoder_in_one_line(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={DATA}',
       f'--workdir={tmp_path}/out'], cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and "'longformer'" in last and 'load_model' in last
  assert not os.path.exists(tmp_path / 'out' / 'checkpoints')

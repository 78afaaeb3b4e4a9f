"""Importing a Hugging Face LED (longformer_jax/convert/led.py) as `EncoderDecoder`.

The reference is transformers' own float32 `LEDForConditionalGeneration` on a
tiny random model (`tests/data/hf/led/`, written by tools/make_hf_fixtures.py):
two encoder layers with total windows 4 and 8 (one-sided 2 and 4), global
tokens 0 and 5 in source row 0 and 0 in row 1, source row 1 right-padded from
position 8; two decoder layers over targets `[2, 7]`, target row 1
right-padded from position 5; perturbed biases, norm scales and
`final_logits_bias`. Only valid target positions are compared.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import hf
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import EncoderDecoder, decoder_context
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.resolved_model import resolved_model
from tests.support.hf_checkpoints import (conversion_error, edited_copy, load_float32,
                                          reference_error)
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf', 'led')


def fixture(file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, file))


@pytest.fixture(scope='module')
def imported():
  return load_float32(DATA)


def led_logits(model_config, params, global_flags) -> np.ndarray:
  """Our logits `[2, 7, vocab]` of the fixture's source and target."""
  source_ctx = encoder_context(jnp.asarray(fixture('attention_mask.npy'), bool),
                               jnp.asarray(global_flags, bool), deterministic=True)
  target_ctx = decoder_context(jnp.asarray(fixture('decoder_attention_mask.npy'), bool),
                               deterministic=True)
  logits, _ = EncoderDecoder(model_config).apply(
      {'params': params}, jnp.asarray(fixture('input_ids.npy')), source_ctx,
      jnp.asarray(fixture('decoder_input_ids.npy')), target_ctx)
  return np.asarray(logits)


def max_error(logits: np.ndarray) -> tuple[float, float]:
  """(largest |ours - reference| over valid positions, largest |reference| there)."""
  return reference_error(logits, fixture('logits.npy'),
                         fixture('decoder_attention_mask.npy').astype(bool))


def test_logits_match_transformers_with_padding_and_global_tokens(imported):
  model_config, params = imported
  error, scale = max_error(led_logits(model_config, params,
                                      fixture('global_attention_mask.npy')))
  assert error <= 1e-4 * scale


def test_the_reference_depends_on_global_tokens_windows_and_logits_bias(imported):
  """The fixture is sensitive to what the import must get right: without the global
  tokens, with layer 0's window in both encoder layers, or without the logits bias,
  the logits move past 1e-2 relative (they match to below 1e-6)."""
  model_config, params = imported
  globals_ = fixture('global_attention_mask.npy')
  error, scale = max_error(led_logits(model_config, params, np.zeros_like(globals_)))
  assert error > 1e-2 * scale
  one_window = dataclasses.replace(model_config, layer_schedule={})
  error, scale = max_error(led_logits(one_window, params, globals_))
  assert error > 1e-2 * scale
  no_bias = dict(params, logits_bias=jnp.zeros_like(params['logits_bias']))
  error, scale = max_error(led_logits(model_config, no_bias, globals_))
  assert error > 1e-2 * scale


def test_settings_follow_the_checkpoint(imported):
  model_config, _ = imported
  assert model_config.attention == 'longformer' and not model_config.causal
  assert model_config.longformer.window == 2            # attention_window 4 -> 2 per side
  assert model_config.layer_schedule['longformer']['window'] == '2,4'
  assert model_config.longformer.global_projections
  assert model_config.num_layers == 2 and model_config.decoder_layers == 2
  assert model_config.block == 'post_ln' and model_config.embedding_norm
  assert model_config.position_embedding == 'learned'
  assert model_config.max_positions == 32 and model_config.decoder_max_positions == 32
  assert model_config.qkv_bias and model_config.out_bias
  assert model_config.ff_activation == 'gelu_exact' and model_config.norm_epsilon == 1e-5
  assert not model_config.scale_tied_logits and model_config.vocab_size == 96


def test_load_model_returns_the_encoder_decoder():
  model, params = hf.load_model(DATA)
  assert isinstance(model, EncoderDecoder)
  assert set(params) == {'embedding', 'position_embedding', 'embedding_norm', 'encoder',
                         'decoder_position_embedding', 'decoder_embedding_norm', 'decoder_0',
                         'decoder_1', 'logits_bias'}


def test_the_default_encoder_decoder_gains_no_parameters():
  """The project's own LED (pre-LN, RoPE) keeps its parameter tree."""
  model = resolve_model(dict(attention='vanilla', num_layers=1, decoder_layers=1, d_model=16,
                             num_heads=2, head_dim=8, d_ff=32, causal=False,
                             attention_backend='xla'))
  config = resolved_model(model, vocab_size=64)
  source, target = jnp.zeros((1, 6), jnp.int32), jnp.zeros((1, 4), jnp.int32)
  source_ctx = encoder_context(jnp.ones((1, 6), bool), jnp.zeros((1, 6), bool), True)
  params = EncoderDecoder(config).init(jax.random.PRNGKey(0), source, source_ctx, target,
                                       decoder_context(jnp.ones((1, 4), bool), True))['params']
  assert set(params) == {'embedding', 'encoder', 'decoder_0', 'decoder_norm'}
  layer = params['decoder_0']
  assert 'bias' not in layer['cross_attention']['query']
  assert 'bias' not in layer['self_attention']['out']


@pytest.mark.parametrize('values, words', [
    ({'position_embedding': 'learned', 'max_positions': 8, 'decoder_layers': 1}, 'must be > 0'),
    ({'decoder_layers': 1, 'decoder_max_positions': 8}, 'keep the default 0'),
    ({'position_embedding': 'learned', 'max_positions': 8, 'decoder_max_positions': 8},
     'keep the default 0')])
def test_decoder_max_positions_is_checked(values, words):
  with pytest.raises(ConfigError) as info:
    resolve_model(values)
  assert 'decoder_max_positions' in str(info.value) and words in str(info.value)


@pytest.mark.parametrize('window, words', [
    ([4, 7], 'even integer'), ([4], 'one window per layer')])
def test_bad_attention_window_is_named(tmp_path, window, words):
  message = conversion_error(edited_copy(
      DATA, tmp_path, edit_config=lambda c: c.update(attention_window=window)))
  assert 'attention_window' in message and words in message


@pytest.mark.parametrize('edit, words', [
    ({'scale_embedding': True}, 'scale_embedding'),
    ({'tie_word_embeddings': False}, 'tie_word_embeddings'),
    ({'decoder_attention_heads': 2}, 'decoder_attention_heads'),
    ({'decoder_ffn_dim': 48}, 'decoder_ffn_dim'),
    ({'activation_function': 'relu'}, 'activation_function')])
def test_unsupported_settings_are_named(tmp_path, edit, words):
  assert words in conversion_error(edited_copy(
      DATA, tmp_path, edit_config=lambda c: c.update(edit)))


@pytest.mark.parametrize('name', [
    'led.decoder.layers.1.encoder_attn.k_proj.weight',
    'led.encoder.layers.0.self_attn.longformer_self_attn.value_global.bias',
    'led.decoder.embed_positions.weight'])
def test_missing_tensor_is_named(tmp_path, name):
  assert name in conversion_error(edited_copy(DATA, tmp_path, edit_tensors=lambda t: t.pop(name)))


def test_wrong_decoder_table_size_is_named(tmp_path):
  message = conversion_error(edited_copy(
      DATA, tmp_path, edit_config=lambda c: c.update(max_decoder_position_embeddings=16)))
  assert 'led.decoder.embed_positions.weight' in message and '(16, 32)' in message


def test_untied_output_copy_is_refused_and_a_tied_one_accepted(tmp_path):
  def add_copies(offset):
    def edit(tensors):
      table = tensors['led.shared.weight']
      tensors['led.encoder.embed_tokens.weight'] = table
      tensors['lm_head.weight'] = table + offset
    return edit
  assert 'lm_head.weight' in conversion_error(edited_copy(
      DATA, tmp_path, edit_tensors=add_copies(1.0)))
  hf.load(edited_copy(DATA, tmp_path, edit_tensors=add_copies(0.0)))


def test_missing_final_logits_bias_reads_as_zeros(tmp_path):
  _, params = hf.load(edited_copy(
      DATA, tmp_path, edit_tensors=lambda t: t.pop('final_logits_bias')))
  np.testing.assert_array_equal(params['logits_bias'], np.zeros(96, np.float32))


def test_logits_bias_is_read_by_seq2seq_only():
  from longformer_jax.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from longformer_jax.experiment_config import resolve_config  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match='model.logits_bias'):
    resolve_config({'task': 'lm', 'model': {'logits_bias': True}})
  model_config, _ = hf.load(DATA)
  assert model_config.logits_bias and model_config.block == 'post_ln'

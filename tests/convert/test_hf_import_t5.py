"""Importing a Hugging Face T5 (longformer_jax/convert/t5.py) as `EncoderDecoder`.

The references are transformers' own float32 `T5ForConditionalGeneration` on
tiny random models (`tests/data/hf/t5*/`, written by tools/make_hf_fixtures.py):
`t5` is v1.0 (ReLU feed-forward, output tied to the embeddings and scaled by
d_model^-0.5), `t5_v11` is v1.1 (gated-GELU feed-forward, an untied
`lm_head`, heads * d_kv = 64 != d_model = 32). Both have two encoder and two
decoder layers, 8 relative position buckets up to distance 20 (12 source
tokens reach the logarithmic buckets), perturbed norm scales and position
biases; source row 1 is right-padded from position 8, target row 1 from
position 5. Only valid target positions are compared.
"""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.relative_buckets import relative_position_bucket
from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import hf
from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import EncoderDecoder, decoder_context
from longformer_jax.models.model_config import resolve_model
from tests.support import hf_checkpoints
from tests.support.hf_checkpoints import conversion_error
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf')
FAMILIES = ('t5', 't5_v11')


def fixture(name: str, file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, name, file))


@pytest.fixture(scope='module', params=FAMILIES)
def imported(request):
  model_config, params = hf.load(os.path.join(DATA, request.param))
  return request.param, model_config, jax.tree_util.tree_map(jnp.asarray, params)


def t5_logits(name: str, model_config, params) -> np.ndarray:
  """Our logits `[2, 7, vocab]` of the fixture's source and target."""
  source_ctx = encoder_context(jnp.asarray(fixture(name, 'attention_mask.npy'), bool),
                               jnp.zeros((2, 12), bool), deterministic=True)
  target_ctx = decoder_context(jnp.asarray(fixture(name, 'decoder_attention_mask.npy'), bool),
                               deterministic=True)
  logits, _ = EncoderDecoder(model_config).apply(
      {'params': params}, jnp.asarray(fixture(name, 'input_ids.npy')), source_ctx,
      jnp.asarray(fixture(name, 'decoder_input_ids.npy')), target_ctx)
  return np.asarray(logits)


def max_error(name: str, logits: np.ndarray) -> tuple[float, float]:
  """(largest |ours - reference| over valid target positions, largest |reference| there)."""
  reference = fixture(name, 'logits.npy')
  valid = fixture(name, 'decoder_attention_mask.npy').astype(bool)
  assert logits.shape == reference.shape
  return np.abs(logits[valid] - reference[valid]).max(), np.abs(reference[valid]).max()


def test_logits_match_transformers(imported):
  name, model_config, params = imported
  error, scale = max_error(name, t5_logits(name, model_config, params))
  assert error <= 1e-4 * scale


def test_the_reference_depends_on_the_relative_position_bias(imported):
  """Without the position bias (every table zero) the logits move past 1e-3 relative."""
  name, model_config, params = imported
  zeroed = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.zeros_like(x) if 'relative_attention_bias' in jax.tree_util.keystr(path)
      else x, params)
  error, scale = max_error(name, t5_logits(name, model_config, zeroed))
  assert error > 1e-3 * scale


def test_settings_follow_the_checkpoint(imported):
  name, model_config, _ = imported
  assert model_config.attention == 'vanilla' and not model_config.causal
  assert model_config.block == 'pre_ln' and model_config.norm == 'rms_norm'
  assert model_config.norm_epsilon == 1e-6 and model_config.num_layers == 2
  assert model_config.decoder_layers == 2 and model_config.num_heads == 4
  assert model_config.position_embedding == 'relative_buckets'
  assert model_config.relative_num_buckets == 8 and model_config.relative_max_distance == 20
  assert not (model_config.qkv_bias or model_config.out_bias or model_config.ff_bias)
  if name == 't5':
    assert model_config.ff_activation == 'relu' and model_config.head_dim == 8
    assert model_config.tie_embeddings and model_config.scale_tied_logits
  else:
    assert model_config.ff_activation == 'geglu' and model_config.head_dim == 16
    assert not model_config.tie_embeddings


def test_every_layer_gets_a_copy_of_block_0s_position_bias(imported):
  name, _, params = imported
  assert set(params) == {'embedding', 'encoder', 'decoder_0', 'decoder_1', 'decoder_norm'}
  assert ('output' in params['embedding']) == (name == 't5_v11')
  tensors = load_file(os.path.join(DATA, name, 'model.safetensors'))
  for side, tables in (
      ('encoder', [params['encoder']['blocks'][f'layer_{i}']['attention'] for i in (0, 1)]),
      ('decoder', [params[f'decoder_{i}']['self_attention'] for i in (0, 1)])):
    saved = tensors[f'{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight']
    for attention in tables:
      np.testing.assert_array_equal(attention['relative_attention_bias']['embedding'], saved)
  assert 'relative_attention_bias' not in params['decoder_0']['cross_attention']


def test_bfloat16_import_runs_close_to_the_reference():
  model_config, params = hf.load(os.path.join(DATA, 't5_v11'), dtype='bfloat16')
  assert model_config.dtype == 'bfloat16'
  params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)
  error, scale = max_error('t5_v11', t5_logits('t5_v11', model_config, params))
  assert error <= 5e-2 * scale


# The bucket function, against the rule of Raffel et al. (2020, sec. 2.1) written as a loop.

def paper_bucket(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
  """One key at `relative = key - query`: half the buckets for keys after the query when
  bidirectional; on a side of n buckets, distances below n/2 exact, then logarithmic bins
  up to max_distance (float32, as the reference computes them), then the last bucket."""
  bucket = 0
  n = num_buckets
  if bidirectional:
    n = num_buckets // 2
    if relative > 0:
      bucket = n
    distance = abs(relative)
  else:
    distance = -relative if relative < 0 else 0
  exact = n // 2
  if distance < exact:
    return bucket + distance
  f32 = np.float32
  log_ratio = f32(math.log(f32(distance) / f32(exact)))       # float32 log, correctly rounded
  scaled = f32(f32(log_ratio / f32(math.log(max_distance / exact))) * f32(n - exact))
  return bucket + min(exact + int(scaled), n - 1)


@pytest.mark.parametrize('num_buckets, max_distance', [
    (32, 128), (8, 20), (16, 64), (6, 100), (38, 100), (19, 4096), (64, 512)])
@pytest.mark.parametrize('bidirectional', [True, False])
def test_buckets_follow_the_papers_rule(num_buckets, max_distance, bidirectional):
  """(6, 100), (38, 100), (19, 4096) have distances where the float32 value is an exact integer
  (log(10) / log(100) * 2 = 1), which a reciprocal multiplication would miss."""
  relative = np.arange(-600, 601)
  got = np.asarray(relative_position_bucket(relative, bidirectional, num_buckets, max_distance))
  expected = [paper_bucket(int(r), bidirectional, num_buckets, max_distance) for r in relative]
  np.testing.assert_array_equal(got, expected)
  assert got.min() == 0
  if max_distance <= 600:      # the last bucket (of an odd count's halves: one unused)
    assert got.max() == num_buckets - 1 - (num_buckets % 2) * bidirectional


@pytest.mark.parametrize('bidirectional, num_buckets, max_distance, pairs', [
    # 16 per side, 8 exact: log(1.5) / log(16) * 8 = 1.17 -> 9; log(2) / log(16) * 8 = 2 -> 10
    (True, 32, 128, [(0, 0), (-1, 1), (-7, 7), (-8, 8), (-12, 9), (-16, 10), (-127, 15),
                     (-128, 15), (-1000, 15), (1, 17), (8, 24), (1000, 31)]),
    # 32 buckets, 16 exact: log(1.25) / log(8) * 16 = 1.72 -> 17; past 128: the last
    (False, 32, 128, [(5, 0), (-15, 15), (-16, 16), (-20, 17), (-127, 31), (-5000, 31)]),
    # the fixtures' 8 buckets to 20: 2 exact per side, log(3.5) / log(10) * 2 = 1.09 -> 3
    (True, 8, 20, [(-1, 1), (-2, 2), (-6, 2), (-7, 3), (1, 5), (2, 6), (7, 7)]),
    (False, 8, 20, [(-3, 3), (-4, 4), (-5, 4), (-6, 5), (-11, 6)])])
def test_hand_computed_buckets(bidirectional, num_buckets, max_distance, pairs):
  relative, expected = zip(*pairs)
  got = relative_position_bucket(np.array(relative), bidirectional, num_buckets, max_distance)
  assert np.asarray(got).tolist() == list(expected)


def test_the_bias_reads_positions_so_a_cache_gives_the_full_sequence():
  """A causal decoder LM with relative buckets fed 3 chunks of 4 tokens, with a cache of the
  8 earlier tokens, equals the same model on all 12 at once (distances up to 11 reach the
  clipped bucket of max_distance 6)."""
  values = dict(attention='vanilla', num_layers=2, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                position_embedding='relative_buckets', relative_num_buckets=8,
                relative_max_distance=6, norm='rms_norm', ff_activation='geglu', ff_bias=False)
  full = lm_model_config(ml_collections.ConfigDict(resolve_model(values)), 64)
  cached = lm_model_config(ml_collections.ConfigDict(resolve_model(dict(values, mem_len=8))), 64)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 64)

  def context(start, length):
    positions = jnp.tile(jnp.arange(start, start + length, dtype=jnp.int32), (2, 1))
    return AttentionContext(positions=positions, segment_ids=jnp.zeros_like(positions),
                            reset=jnp.full((2,), start == 0), valid=jnp.ones((2, length), bool))

  params = DecoderLM(full).init(jax.random.PRNGKey(0), tokens, DecoderLM.init_state(full, 2),
                                context(0, 12))['params']
  params = jax.tree_util.tree_map_with_path(   # position biases that weigh on the logits
      lambda path, x: x * 50.0 if 'relative_attention_bias' in jax.tree_util.keystr(path)
      else x, params)
  expected, _, _ = DecoderLM(full).apply({'params': params}, tokens,
                                         DecoderLM.init_state(full, 2), context(0, 12))
  states, chunks = DecoderLM.init_state(cached, 2), []
  for start in (0, 4, 8):
    logits, states, _ = DecoderLM(cached).apply({'params': params}, tokens[:, start:start + 4],
                                                states, context(start, 4))
    chunks.append(logits)
  np.testing.assert_allclose(np.concatenate(chunks, axis=1), expected, rtol=1e-5, atol=1e-5)
  no_bias = jax.tree_util.tree_map_with_path(
      lambda path, x: 0 * x if 'relative_attention_bias' in jax.tree_util.keystr(path) else x,
      params)
  unbiased, _, _ = DecoderLM(full).apply({'params': no_bias}, tokens,
                                         DecoderLM.init_state(full, 2), context(0, 12))
  assert np.abs(np.asarray(unbiased) - np.asarray(expected)).max() > 1e-2


@pytest.mark.parametrize('activation', ['relu', 'geglu'])
def test_feed_forward_activations(activation):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 8))
  settings = FeedForwardConfig(d_ff=16, ff_activation=activation, ff_bias=False)
  layer = FeedForward(settings, 8, 0.0)
  params = layer.init(jax.random.PRNGKey(1), x)['params']
  kernel = lambda name: np.asarray(params[name]['kernel'].unbox(), np.float64)
  h = np.asarray(x, np.float64) @ kernel('wi')
  if activation == 'relu':
    h = np.maximum(h, 0.0)
  else:   # the tanh GELU of the gate times the linear unit
    gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    h = gelu * (np.asarray(x, np.float64) @ kernel('wi_up'))
  np.testing.assert_allclose(layer.apply({'params': params}, x), h @ kernel('wo'), atol=1e-5)
  chunked = FeedForward(dataclasses.replace(settings, ff_chunk_size=4), 8, 0.0)
  np.testing.assert_allclose(chunked.apply({'params': params}, x),
                             layer.apply({'params': params}, x), atol=1e-6)


# Settings: one-line errors naming the key.

def config_error(values) -> ConfigError:
  with pytest.raises(ConfigError) as info:
    resolve_model(values)
  assert '\n' not in str(info.value)
  return info.value


RELATIVE = {'position_embedding': 'relative_buckets'}


@pytest.mark.parametrize('values, key, words', [
    (dict(RELATIVE, relative_num_buckets=2), 'relative_num_buckets', '>= 4'),
    (dict(RELATIVE, relative_max_distance=16), 'relative_max_distance', '> relative_num_buckets'),
    ({'relative_num_buckets': 16}, 'relative_num_buckets', "'relative_buckets'"),
    ({'position_embedding': 'learned', 'max_positions': 8, 'relative_max_distance': 64},
     'relative_max_distance', "'relative_buckets'"),
    ({'position_embedding': 'buckets'}, 'position_embedding', 'relative_buckets'),
    (dict(RELATIVE, attention_backend='splash'), 'attention_backend', 'relative position bias'),
    (dict(RELATIVE, ff_activation='swish'), 'ff_activation', 'geglu')])
def test_bad_settings_name_their_key(values, key, words):
  error = config_error(values)
  assert error.key == f'model.{key}' and words in error.message


@pytest.mark.parametrize('attention', ['attendre', 'memorizing', 'streaming_sinks', 'longformer'])
def test_relative_buckets_are_vanilla_only(attention):
  error = config_error(dict(RELATIVE, attention=attention))
  assert error.key == 'model.position_embedding' and repr(attention) in error.message


def test_relative_buckets_are_refused_in_a_scheduled_memory_layer():
  error = config_error(dict(RELATIVE, num_layers=2,
                            layer_schedule={'attention': 'vanilla,attendre'}))
  assert error.key == 'model.position_embedding' and "'attendre'" in error.message


def test_t5_settings_resolve():
  resolved = resolve_model(dict(RELATIVE, relative_num_buckets=8, relative_max_distance=20,
                                ff_activation='relu', norm='rms_norm', mem_len=4))
  assert resolved['relative_num_buckets'] == 8
  resolve_model({'ff_activation': 'geglu', 'ff_bias': False})


# Checkpoints: one-line errors naming the culprit.

def edited_copy(tmp_path, name: str, edit_tensors=None, edit_config=None) -> str:
  return hf_checkpoints.edited_copy(os.path.join(DATA, name), tmp_path, edit_tensors, edit_config)


@pytest.mark.parametrize('edit, words', [
    ({'feed_forward_proj': 'gated-silu'}, 'feed_forward_proj'),
    ({'feed_forward_proj': 'gelu'}, 'feed_forward_proj'),
    ({'dense_act_fn': 'gelu'}, 'dense_act_fn'),
    ({'is_encoder_decoder': False}, 'is_encoder_decoder'),
    ({'num_decoder_layers': 0}, 'num_decoder_layers'),
    ({'d_kv': 7}, 'd_kv'),
    ({'relative_attention_num_buckets': 2}, 'relative_attention_num_buckets'),
    ({'relative_attention_max_distance': 4}, 'relative_attention_max_distance')])
def test_unsupported_settings_are_named(tmp_path, edit, words):
  edited = edited_copy(tmp_path, 't5_v11', edit_config=lambda c: c.update(edit))
  assert words in conversion_error(edited)


@pytest.mark.parametrize('name, tensor', [
    ('t5', 'decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'),
    ('t5', 'encoder.block.1.layer.1.DenseReluDense.wi.weight'),
    ('t5_v11', 'encoder.block.1.layer.1.DenseReluDense.wi_1.weight'),
    ('t5_v11', 'decoder.block.1.layer.1.EncDecAttention.q.weight'),
    ('t5_v11', 'lm_head.weight'),
    ('t5_v11', 'decoder.final_layer_norm.weight')])
def test_missing_tensor_is_named(tmp_path, name, tensor):
  edited = edited_copy(tmp_path, name, edit_tensors=lambda t: t.pop(tensor))
  assert tensor in conversion_error(edited)


def test_wrong_bucket_count_names_the_table(tmp_path):
  message = conversion_error(edited_copy(
      tmp_path, 't5', edit_config=lambda c: c.update(relative_attention_num_buckets=16)))
  assert 'encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight' in message
  assert '(16, 4)' in message


def test_a_bias_table_in_a_later_layer_is_unexpected(tmp_path):
  def edit(tensors):
    tensors['encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight'] = (
        tensors['encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'])
  assert 'unexpected tensor' in conversion_error(edited_copy(tmp_path, 't5', edit_tensors=edit))


def test_old_cross_attention_bias_is_ignored_as_in_transformers(tmp_path):
  def edit(tensors):
    tensors['decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight'] = (
        np.ones((8, 4), np.float32))
  hf.load(edited_copy(tmp_path, 't5', edit_tensors=edit))


def test_tied_copies_must_equal_the_shared_table(tmp_path):
  def add_copies(offset):
    def edit(tensors):
      table = tensors['shared.weight']
      tensors['encoder.embed_tokens.weight'] = table
      tensors['lm_head.weight'] = table + offset
    return edit
  message = conversion_error(edited_copy(tmp_path, 't5', edit_tensors=add_copies(1.0)))
  assert 'lm_head.weight' in message and 'tie_word_embeddings' in message
  hf.load(edited_copy(tmp_path, 't5', edit_tensors=add_copies(0.0)))


def test_a_v4_config_without_scale_decoder_outputs_means_the_same(tmp_path):
  """Configs written before transformers 5 have no `scale_decoder_outputs`: a tied output is
  then scaled (v1.0); transformers 5's `scale_decoder_outputs: false` with a tied output
  (a v1.1-style file it wrote) is not."""
  def drop_scale(config):
    config.pop('scale_decoder_outputs')
  model_config, _ = hf.load(edited_copy(tmp_path, 't5', edit_config=drop_scale))
  assert model_config.tie_embeddings and model_config.scale_tied_logits
  model_config, _ = hf.load(edited_copy(
      tmp_path, 't5', edit_config=lambda c: c.update(scale_decoder_outputs=False)))
  assert model_config.tie_embeddings and not model_config.scale_tied_logits


def test_scaled_untied_output_folds_the_scale_into_the_kernel(tmp_path):
  _, params = hf.load(edited_copy(
      tmp_path, 't5_v11', edit_config=lambda c: c.update(scale_decoder_outputs=True)))
  lm_head = load_file(os.path.join(DATA, 't5_v11', 'model.safetensors'))['lm_head.weight']
  np.testing.assert_allclose(params['embedding']['output']['kernel'], lm_head.T / np.sqrt(32),
                             rtol=1e-6)

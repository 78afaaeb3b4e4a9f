"""RoPE scalings yarn, dynamic (NTK) and longrope (layers/positional.py, convert/llama.py).

Fixtures (tests/data/hf/llama_{yarn,dynamic,longrope}, tools/make_hf_fixtures.py): tiny
Llamas with head_dim 16 whose inputs of 40 tokens pass the original context (yarn: 32;
dynamic and longrope: 16), rows valid for 40, 30 and 12 tokens, and transformers' float32
logits of each row's tokens run alone; the yarn one also holds transformers' greedy tokens
after a 100-token prompt. The imported model must give those logits to 1e-4 of the
largest fed whole, and the yarn greedy tokens through generate.py's default decoder; the
key/value cache must rotate every key at the current length (dynamic, longrope).

The frequencies and attention factors are checked against a float64 numpy
reimplementation written here from the published formulas (not the project's code), and
every bad setting is one line naming its key.
"""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import generate
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.checkpoint_heads import CheckpointHeads
from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import hf
from longformer_jax.convert.llama import rope_settings
from longformer_jax.convert.workdir_cli import convert_to_workdir
from longformer_jax.generation.chunk_window_decoder import ChunkWindowDecoder
from longformer_jax.generation.kv_cache import kv_cache_model_config
from longformer_jax.layers import positional
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.model_config import resolve_model
from tests.support.hf_checkpoints import conversion_error, edited_copy

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'hf')
FIXTURES = ('llama_yarn', 'llama_dynamic', 'llama_longrope')
HEAD_DIM, THETA = 16, 10000.0


def fixture(name: str, file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, name, file))


# ---- a float64 reimplementation of the formulas -------------------------------------------

def base_frequencies(theta: float = THETA, head_dim: int = HEAD_DIM) -> np.ndarray:
  return theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)


def yarn_reference(factor, original, beta_fast=32.0, beta_slow=1.0, truncate=True,
                   mscale=None, mscale_all_dim=None, attention_factor=None):
  """(inv_freq, attention factor) of YaRN (Peng et al., 2023: "NTK-by-parts" and the
  attention temperature) as transformers applies it: frequency i turns
  original * f_i / (2 pi) times within the original context;
  the index range between beta_fast and beta_slow turns is a linear ramp from kept to
  divided by the factor."""
  freq = base_frequencies()
  turns_index = lambda turns: (HEAD_DIM * math.log(original / (2 * math.pi * turns))
                               / (2 * math.log(THETA)))
  first, last = turns_index(beta_fast), turns_index(beta_slow)
  if truncate:
    first, last = math.floor(first), math.ceil(last)
  first, last = max(first, 0), min(last, HEAD_DIM - 1)
  if first == last:
    last += 0.001
  divided = np.clip((np.arange(HEAD_DIM // 2) - first) / (last - first), 0.0, 1.0)
  inv_freq = (1 - divided) * freq + divided * freq / factor
  temperature = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
  if attention_factor is None:
    attention_factor = (temperature(mscale) / temperature(mscale_all_dim)
                        if mscale and mscale_all_dim else temperature(1.0))
  return inv_freq, attention_factor


def dynamic_reference(factor, original, length):
  """Dynamic NTK: base theta * (factor L / n - factor + 1)^(d / (d - 2)) once L > n."""
  if length <= original:
    return base_frequencies()
  base = THETA * (factor * length / original - factor + 1) ** (HEAD_DIM / (HEAD_DIM - 2))
  return base_frequencies(base)


def longrope_reference(short, long, original, length, factor=None, attention_factor=None):
  """LongRoPE (Ding et al., 2024): f_i / long_i past the original context, else f_i / short_i;
  attention factor sqrt(1 + ln factor / ln original)."""
  scale = np.asarray(long if length > original else short, np.float64)
  if attention_factor is None:
    attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor)
                                                          / math.log(original))
  return base_frequencies() / scale, attention_factor


YARN_CASES = [
    dict(factor=4.0, original_max_position_embeddings=32),
    dict(factor=8.0, original_max_position_embeddings=64, truncate=False),
    dict(factor=4.0, original_max_position_embeddings=32, beta_fast=16.0, beta_slow=2.0,
         mscale=1.0, mscale_all_dim=0.5),
    dict(factor=16.0, original_max_position_embeddings=4096, attention_factor=1.25),
    # one turn count for both ends, untruncated: a zero-width ramp (transformers widens it)
    dict(factor=2.0, original_max_position_embeddings=4096, beta_fast=4.0, beta_slow=4.0,
         truncate=False),
]


@pytest.mark.parametrize('case', YARN_CASES)
def test_yarn_frequencies_and_attention_factor(case):
  scaling = dict(type='yarn', **case)
  expected, factor = yarn_reference(case['factor'], case['original_max_position_embeddings'],
                                    **{k: v for k, v in case.items() if k not in (
                                        'factor', 'original_max_position_embeddings')})
  np.testing.assert_allclose(positional.rotary_inv_freq(HEAD_DIM, THETA, scaling), expected,
                             rtol=2e-6)
  assert positional.rotary_attention_factor(scaling) == pytest.approx(factor, rel=1e-12)


def test_dynamic_frequencies_follow_each_rows_length():
  scaling = dict(type='dynamic', factor=2.0, original_max_position_embeddings=16)
  lengths = [1, 16, 17, 40, 1000]
  ours = positional.rotary_inv_freq(HEAD_DIM, THETA, scaling, jnp.asarray(lengths))
  for row, length in enumerate(lengths):
    np.testing.assert_allclose(ours[row], dynamic_reference(2.0, 16, length), rtol=2e-6)
  assert positional.rotary_attention_factor(scaling) == 1.0


@pytest.mark.parametrize('extra', [dict(factor=4.0), dict(factor=1.0),
                                   dict(factor=4.0, attention_factor=1.5),
                                   dict(attention_factor=0.9)])
def test_longrope_frequencies_and_attention_factor(extra):
  short, long = np.linspace(1.0, 1.6, 8).tolist(), np.geomspace(1.0, 9.0, 8).tolist()
  scaling = dict(type='longrope', short_factor=short, long_factor=long,
                 original_max_position_embeddings=16, **extra)
  lengths = [12, 16, 17, 40]
  ours = positional.rotary_inv_freq(HEAD_DIM, THETA, scaling, jnp.asarray(lengths))
  for row, length in enumerate(lengths):
    expected, factor = longrope_reference(short, long, 16, length, **extra)
    np.testing.assert_allclose(ours[row], expected, rtol=2e-6)
  assert positional.rotary_attention_factor(scaling) == pytest.approx(factor, rel=1e-12)


def test_length_dependent_scalings_need_the_extent():
  with pytest.raises(ValueError, match='extent'):
    positional.rotary_inv_freq(HEAD_DIM, THETA, dict(type='dynamic', factor=2.0,
                                                     original_max_position_embeddings=16))


def yarn_heads() -> CheckpointHeads:
  scaling = dict(YARN_CASES[2], type='yarn')
  return CheckpointHeads(num_kv_heads=0, qkv_bias=False, out_bias=False, rotary=True,
                         rope_theta=THETA, rope_scaling=tuple(sorted(scaling.items())),
                         relative_num_buckets=0, relative_max_distance=128)


def test_checkpoint_heads_scale_rotations_and_capped_scores():
  """The attention factor reaches every rotation of the shared heads, the LM-Infinite cap's
  far keys included: scores are factor^2 q_i^T R(min(p_i - p_j, L)) k_j."""
  heads = yarn_heads()
  inv_freq, factor = yarn_reference(4.0, 32, beta_fast=16.0, beta_slow=2.0, mscale=1.0,
                                    mscale_all_dim=0.5)
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 1, 6, 1, HEAD_DIM)).astype(np.float32)
  np.testing.assert_allclose(heads.rotate(jnp.asarray(q), jnp.zeros((1, 6), jnp.int32)),
                             factor * q, rtol=1e-6)
  positions = jnp.arange(6, dtype=jnp.int32)[None, :]
  scores = np.asarray(heads.scores(jnp.asarray(q), jnp.asarray(k), positions, positions,
                                   max_distance=2))[0, 0]

  def rotated(x, position):
    angles = position * inv_freq
    x1, x2 = x[:HEAD_DIM // 2], x[HEAD_DIM // 2:]
    return np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                           x2 * np.cos(angles) + x1 * np.sin(angles)])

  for i in range(6):
    for j in range(6):
      expected = factor ** 2 * rotated(q[0, i, 0], min(i - j, 2)) @ rotated(k[0, j, 0], 0)
      assert scores[i, j] == pytest.approx(expected, rel=1e-4, abs=1e-5), (i, j)


# ---- the fixtures -------------------------------------------------------------------------

@pytest.fixture(scope='module')
def imported():
  """name -> (model_config, float32 params) of each fixture, imported once."""
  loaded = {}
  for name in FIXTURES:
    model_config, params = hf.load(os.path.join(DATA, name))
    loaded[name] = model_config, jax.tree_util.tree_map(jnp.asarray, params)
  return loaded


def relative_error(name: str, logits: np.ndarray) -> float:
  """Largest |ours - transformers'| over the valid positions, over the largest |logit|."""
  reference = fixture(name, 'logits.npy')
  valid = fixture(name, 'attention_mask.npy').astype(bool)
  return np.abs(logits[valid] - reference[valid]).max() / np.abs(reference[valid]).max()


def forward(model_config, params, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """float32 `[batch, length, vocab]` logits of one chunk holding the whole padded batch."""
  batch, length = tokens.shape
  positions = jnp.tile(jnp.arange(length, dtype=jnp.int32), (batch, 1))
  ctx = AttentionContext(positions=positions, segment_ids=jnp.zeros_like(positions),
                         reset=jnp.ones((batch,), bool), valid=jnp.asarray(mask, bool))
  logits, _, _ = jax.jit(DecoderLM(model_config).apply)(
      {'params': params}, jnp.asarray(tokens), DecoderLM.init_state(model_config, batch), ctx)
  return np.asarray(logits)


@pytest.mark.parametrize('name', FIXTURES)
def test_logits_equal_transformers(imported, name):
  model_config, params = imported[name]
  logits = forward(model_config, params, fixture(name, 'input_ids.npy'),
                   fixture(name, 'attention_mask.npy'))
  error = relative_error(name, logits)
  print(f'{name}: max |ours - transformers| / max |logit| = {error:.3g}')
  assert error < 1e-4


@pytest.mark.parametrize('name', ['llama_dynamic', 'llama_longrope'])
def test_key_value_decoding_rotates_every_key_at_the_current_length(imported, name):
  """Decoding one token at a time (generate.py's key/value cache), each step rotates its
  query and every cached key with the frequencies of the text so far. With one layer, where
  no hidden state of an earlier step enters, that is exactly one forward of the text: each
  row's logits after its last token equal the one-chunk forward of the padded batch (rows of
  40 and 30 tokens scaled, 12 not). (With more layers the cached keys come from hidden
  states computed at shorter lengths: docs/import.md, "RoPE scalings".)"""
  model_config, params = imported[name]
  model_config = dataclasses.replace(model_config, num_layers=1)
  params = {**params, 'blocks': {'layer_0': params['blocks']['layer_0']}}
  tokens, mask = fixture(name, 'input_ids.npy'), fixture(name, 'attention_mask.npy')
  whole = forward(model_config, params, tokens, mask)
  decoder = ChunkWindowDecoder(
      kv_cache_model_config(ml_collections.ConfigDict(model_config.model_values()),
                            model_config.vocab_size, 64), params, chunk_len=1, pad_id=0)
  for row, valid in enumerate(mask.sum(axis=1)):
    state = decoder.append(decoder.start(tokens[row, :valid - 1]), int(tokens[row, valid - 1]))
    expected = whole[row, valid - 1]
    error = np.abs(np.asarray(state.logits) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, (row, error)


def test_yarn_generation_gives_transformers_greedy_tokens(tmp_path):
  """generate.py's default decoder (the key/value cache of the 128-token context) after the
  fixture's 100-token prompt: each step's logits transformers', their argmax its tokens."""
  workdir = str(tmp_path / 'run')
  convert_to_workdir(os.path.join(DATA, 'llama_yarn'), workdir)
  decoder, _, _ = generate.load_decoder(workdir)
  greedy, reference = fixture('llama_yarn', 'greedy_ids.npy'), fixture('llama_yarn',
                                                                         'greedy_logits.npy')
  state = decoder.start(fixture('llama_yarn', 'long_prompt_ids.npy'))
  for step, token in enumerate(greedy):
    logits = np.asarray(state.logits)[:reference.shape[1]]
    assert np.abs(logits - reference[step]).max() <= 1e-4 * np.abs(reference[step]).max()
    assert int(np.argmax(logits)) == token, step
    state = decoder.append(state, int(token))


# ---- the importer and the settings --------------------------------------------------------

def test_import_makes_transformers_defaults_explicit():
  base = {'model_type': 'llama', 'max_position_embeddings': 128}
  _, yarn = rope_settings(dict(base, rope_parameters={'rope_type': 'yarn', 'factor': None,
                                                      'original_max_position_embeddings': 32,
                                                      'beta_fast': None, 'mscale': 0}))
  assert yarn == {'type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32}
  _, yarn = rope_settings(dict(base, rope_scaling={'type': 'yarn', 'factor': 2.0}))
  assert yarn['original_max_position_embeddings'] == 128
  _, dynamic = rope_settings(dict(base, rope_scaling={
      'rope_type': 'dynamic', 'factor': 2.0, 'original_max_position_embeddings': 8}))
  assert dynamic['original_max_position_embeddings'] == 128     # transformers' threshold
  theta, longrope = rope_settings(dict(base, rope_theta=500.0, rope_scaling={
      'rope_type': 'longrope', 'short_factor': [1] * 8, 'long_factor': [2] * 8,
      'original_max_position_embeddings': 32}))
  assert theta == 500.0 and longrope['factor'] == 4.0 and 'attention_factor' not in longrope


@pytest.mark.parametrize('edit,culprit', [
    ({'rope_type': 'proportional'}, 'rope_type'),
    ({'rope_type': 'dynamic', 'factor': None}, 'rope_scaling.factor'),
    ({'rope_type': 'longrope', 'long_factor': None}, 'rope_scaling.long_factor'),
    ({'partial_rotary_factor': 0.5}, 'partial_rotary_factor'),
    ({'rope_type': 'linear', 'factor': 2.0, 'partial_rotary_factor': 0.5},
     'partial_rotary_factor'),
    ({'rope_type': 'llama3', 'partial_rotary_factor': 0.5}, 'partial_rotary_factor'),
    ({'short_factor': [1.0] * 7}, 'short_factor'),
])
def test_import_refusals_name_the_key(edit, culprit, tmp_path):
  def update(config):
    config['rope_parameters'].update(edit)
  message = conversion_error(edited_copy(os.path.join(DATA, 'llama_longrope'), tmp_path,
                                         edit_config=update))
  assert culprit in message, message


YARN = dict(type='yarn', factor=4.0, original_max_position_embeddings=32)
LONGROPE = dict(type='longrope', short_factor=[1.0] * 8, long_factor=[2.0] * 8,
                original_max_position_embeddings=16, factor=4.0)


@pytest.mark.parametrize('scaling,culprit', [
    (dict(YARN, beta_fast=-1.0), 'beta_fast'),
    (dict(YARN, beta_slow='1'), 'beta_slow'),
    (dict(YARN, mscale=0.0), 'mscale'),
    (dict(YARN, attention_factor=0), 'attention_factor'),
    (dict(YARN, truncate='yes'), 'truncate'),
    (dict(YARN, low_freq_factor=1.0), 'low_freq_factor'),
    ({'type': 'yarn', 'factor': 4.0}, 'original_max_position_embeddings'),
    ({'type': 'dynamic', 'factor': 0.0, 'original_max_position_embeddings': 16}, 'factor'),
    ({'type': 'dynamic', 'factor': 2.0}, 'original_max_position_embeddings'),
    (dict(LONGROPE, short_factor=[1.0] * 4, long_factor=[2.0] * 4), 'short_factor'),
    (dict(LONGROPE, long_factor=[2.0] * 7), 'long_factor'),
    (dict(LONGROPE, long_factor=2.0), 'long_factor'),
    (dict(LONGROPE, short_factor=[1.0] * 7 + [-1.0]), 'short_factor'),
    ({k: v for k, v in LONGROPE.items() if k != 'factor'}, 'factor'),
    ({'type': 'ntk', 'factor': 2.0}, 'type'),
])
def test_bad_settings_name_their_key(scaling, culprit):
  with pytest.raises(ConfigError) as info:
    resolve_model({'head_dim': HEAD_DIM, 'rope_scaling': scaling})
  message = str(info.value)
  assert info.value.key == 'model.rope_scaling' and culprit in info.value.message, message
  assert '\n' not in message


@pytest.mark.parametrize('scaling', [YARN, dict(YARN, truncate=False, beta_fast=8, mscale=1.0,
                                                 mscale_all_dim=1.0), LONGROPE,
                                     {'type': 'dynamic', 'factor': 2.0,
                                      'original_max_position_embeddings': 16}])
def test_good_settings_resolve(scaling):
  assert dict(resolve_model({'head_dim': HEAD_DIM, 'rope_scaling': scaling})['rope_scaling']) \
      == scaling

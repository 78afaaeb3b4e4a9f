"""Key/value-cache decoding (generation/kv_cache.py) against full recomputes.

One token per step with a cache of M tokens per layer must give, at every
step, the logits of the full causal model over the text so far while the
text fits in M + 1 tokens: checked against a one-chunk forward of a tiny
vanilla model (with documents of grouped heads and RoPE), against
transformers' logits for an imported Llama (tests/data/hf), and against the
chunk-window decoder on the same checkpoint. Past M + 1 tokens the oldest
drop out (the logits then differ).
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from longformer_jax.config.errors import UserError
from longformer_jax.convert import hf
from longformer_jax.generation.chunk_window_decoder import ChunkWindowDecoder, chunk_context
from longformer_jax.generation.kv_cache import kv_cache_model_config
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from tests.support.full_causal_logits import full_logits
from tests.support.repo_paths import REPO_ROOT as REPO
from tests.support.tiny_models import VOCAB, tiny_config

LENGTH = 12


def cached_logits(model, vocab, params, tokens: np.ndarray, cache_size: int,
                  prompt_len: int) -> np.ndarray:
  """`[len - prompt_len + 1, vocab]`: the KV decoder's logits after the prompt, then after
  each further token fed one at a time."""
  decoder = ChunkWindowDecoder(kv_cache_model_config(model, vocab, cache_size), params,
                               chunk_len=1, pad_id=0)
  state = decoder.start(tokens[:prompt_len])
  out = [np.asarray(state.logits)]
  for token in tokens[prompt_len:]:
    state = decoder.append(state, int(token))
    out.append(np.asarray(state.logits))
  return np.stack(out)


@pytest.fixture(scope='module')
def tiny_vanilla():
  config = tiny_config(attention='vanilla', num_heads=4, head_dim=8, num_kv_heads=2,
                       rope_theta=500.0)
  model_config = lm_model_config(config.model, VOCAB)
  tokens = np.random.default_rng(0).integers(1, VOCAB, LENGTH).astype(np.int32)
  params = DecoderLM(model_config).init(
      jax.random.PRNGKey(0), jnp.asarray(tokens[None, :]), DecoderLM.init_state(model_config, 1),
      chunk_context(jnp.arange(LENGTH, dtype=jnp.int32)[None, :], LENGTH))['params']
  return config.model, model_config, params, tokens


@pytest.mark.parametrize('prompt_len', [1, 5])
def test_cached_steps_equal_the_full_model_within_the_cache(tiny_vanilla, prompt_len):
  model, model_config, params, tokens = tiny_vanilla
  full = full_logits(model_config, params, tokens)
  cached = cached_logits(model, VOCAB, params, tokens, LENGTH - 1, prompt_len)
  np.testing.assert_allclose(cached, full[prompt_len - 1:], rtol=1e-5, atol=1e-5)


def test_past_the_cache_the_oldest_tokens_drop_out(tiny_vanilla):
  model, model_config, params, tokens = tiny_vanilla
  full = full_logits(model_config, params, tokens)
  cached = cached_logits(model, VOCAB, params, tokens, 4, 1)   # a window of 5 tokens
  np.testing.assert_allclose(cached[:5], full[:5], rtol=1e-5, atol=1e-5)
  assert np.abs(cached[5:] - full[5:]).max() > 1e-3


def test_imported_llama_decodes_to_transformers_logits():
  data = os.path.join(REPO, 'tests', 'data', 'hf', 'llama')
  model_config, params = hf.load(data)
  params = jax.tree_util.tree_map(jnp.asarray, params)
  tokens = np.load(os.path.join(data, 'input_ids.npy'))[0]
  reference = np.load(os.path.join(data, 'logits.npy'))[0]
  model = ml_collections.ConfigDict(model_config.to_dict())
  cached = cached_logits(model, model_config.vocab_size, params, tokens, 16, 3)
  scale = np.abs(reference).max()
  np.testing.assert_allclose(cached[:, :reference.shape[-1]], reference[2:], rtol=0,
                             atol=1e-4 * scale)


@pytest.mark.parametrize('overrides, words', [
    ({'attention': 'xl'}, "model.attention='xl'"),
    ({'attention': 'vanilla', 'position_embedding': 'learned', 'max_positions': 64},
     'model.position_embedding'),
])
def test_models_without_a_vanilla_cache_are_refused(overrides, words):
  model = tiny_config(**overrides).model
  with pytest.raises(UserError, match=words):
    kv_cache_model_config(model, VOCAB, 8)
  with pytest.raises(UserError, match='must be >= 1'):
    kv_cache_model_config(tiny_config(attention='vanilla').model, VOCAB, 0)

"""StreamingLLM attention against a token-by-token python reference (float64).

The reference decodes every token the way StreamingLLM's KV cache does: the
cache of token t is the first `s` tokens of its document plus its `w` most
recent tokens (itself included), listed in text order; RoPE positions are
the slots 0..n-1 of that list ('cache' mode, Xiao et al. 2023, section 3.2)
or the text positions ('original' mode). The layer processes the same
stream chunk by chunk, with documents starting at chunk starts (reset) and in
the middle of chunks.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.streaming_sinks import StreamingSinkAttention, StreamingSinksConfig
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.migration import migrate_flat_model
from tests.support.position_references import numpy_rotate
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config
from train import train

B, C, NUM_CHUNKS, D, H, HD = 2, 6, 4, 16, 2, 8
T = C * NUM_CHUNKS
DOC_STARTS = ([0, 9, 20], [0, 12, 13])    # row 1: a reset at a chunk start, a 1-token document


def stream_segments():
  segments = np.zeros((B, T), np.int32)
  for row, starts in enumerate(DOC_STARTS):
    for start in starts[1:]:
      segments[row, start:] += 1
  return segments


def reference_cache(t, doc_start, num_sinks, window):
  """Text positions in token t's cache, in text order."""
  doc = list(range(doc_start, t + 1))
  keep = set(doc[:num_sinks]) | set(doc[-window:])
  return sorted(keep)


def reference_outputs(params, x, num_sinks, window, mode):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  q_all = np.einsum('btd,dhe->bthe', x, p['query']['kernel'])
  k_all = np.einsum('btd,dhe->bthe', x, p['key']['kernel'])
  v_all = np.einsum('btd,dhe->bthe', x, p['value']['kernel'])
  out = np.zeros((B, T, H, HD))
  for b in range(B):
    for t in range(T):
      doc_start = max(s for s in DOC_STARTS[b] if s <= t)
      cache = reference_cache(t, doc_start, num_sinks, window)
      rope_pos = np.arange(len(cache)) if mode == 'cache' else np.array(cache)
      q = numpy_rotate(q_all[b:b + 1, t:t + 1], rope_pos[None, -1:])[0, 0]          # [h, e]
      k = numpy_rotate(k_all[b:b + 1, cache], rope_pos[None])[0]                   # [n, h, e]
      scores = np.einsum('he,nhe->hn', q, k) / np.sqrt(HD)
      w = np.exp(scores - scores.max(-1, keepdims=True))
      w /= w.sum(-1, keepdims=True)
      out[b, t] = np.einsum('hn,nhe->he', w, v_all[b, cache])
  return np.einsum('bthe,hed->btd', out, p['out']['kernel'])


def run_stream(module, params, x, state, segments):
  apply = jax.jit(module.apply)
  outputs, states = [], []
  for c in range(NUM_CHUNKS):
    positions = np.tile(np.arange(c * C, (c + 1) * C, dtype=np.int32), (B, 1))
    reset = np.array([c * C in starts for starts in DOC_STARTS])
    ctx = AttentionContext(positions=jnp.asarray(positions),
                           segment_ids=jnp.asarray(segments[:, c * C:(c + 1) * C]),
                           reset=jnp.asarray(reset), valid=jnp.ones((B, C), bool))
    y, state, _ = apply({'params': params}, x[:, c * C:(c + 1) * C], state, ctx)
    outputs.append(np.asarray(y))
    states.append(jax.device_get(state))
  return np.concatenate(outputs, axis=1), states


def module_and_params(num_sinks, window, mode):
  """The layer, shared parameters (their shapes do not depend on s, w, mode), inputs, state."""
  config = sinks_config(num_sinks=num_sinks, window=window, positions=mode)
  module = attention_layer(config, jnp.float32)
  state = attention_state(config, B, jnp.float32)
  return module, shared_params(), random_inputs(), state


def sinks_config(**sinks):
  """A tiny streaming_sinks model; `sinks` are keys of `model.streaming_sinks`."""
  return tiny_model_config(attention='streaming_sinks', d_model=D, num_heads=H, head_dim=HD,
                           streaming_sinks=sinks)


@functools.lru_cache(maxsize=None)
def shared_params():
  section = StreamingSinksConfig(num_sinks=1, window=2)
  shared = shared_settings(num_heads=H, head_dim=HD, d_model=D)
  module = StreamingSinkAttention(config=section, shared=shared)
  state = StreamingSinkAttention.init_state(section, shared, B)
  ctx = AttentionContext(positions=jnp.zeros((B, C), jnp.int32), segment_ids=jnp.zeros((B, C), jnp.int32),
                         reset=jnp.ones((B,), bool), valid=jnp.ones((B, C), bool))
  return jax.jit(module.init)(jax.random.PRNGKey(0), random_inputs()[:, :C], state, ctx)['params']


def random_inputs():
  return jax.random.normal(jax.random.PRNGKey(1), (B, T, D))


@pytest.mark.parametrize('num_sinks,window,mode', [
    (2, 5, 'cache'), (2, 5, 'original'), (3, 2, 'cache'), (0, 4, 'cache'), (2, 1, 'cache'),
    (4, 9, 'cache')])
def test_matches_token_by_token_streaming_llm(num_sinks, window, mode):
  module, params, x, state = module_and_params(num_sinks, window, mode)
  got, _ = run_stream(module, params, x, state, stream_segments())
  expected = reference_outputs(params, np.asarray(x, np.float64), num_sinks, window, mode)
  np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)


def test_cache_keeps_exactly_sinks_and_window():
  """After each chunk: the store holds the current document's first s tokens,
  the FIFO the last w - 1 tokens, each with its text position."""
  num_sinks, window = 2, 5
  module, params, x, state = module_and_params(num_sinks, window, 'cache')
  segments = stream_segments()
  _, states = run_stream(module, params, x, state, segments)
  for c, st in enumerate(states):
    end = (c + 1) * C                       # tokens 0 .. end - 1 seen
    for b in range(B):
      doc_start = max(s for s in DOC_STARTS[b] if s < end)
      sinks = sorted(np.asarray(st['sinks'].positions[b])[np.asarray(st['sinks'].valid[b])])
      assert sinks == list(range(doc_start, min(doc_start + num_sinks, end)))
      fifo_valid = np.asarray(st['window'].valid[b])
      assert sorted(np.asarray(st['window'].positions[b])[fifo_valid]) == list(
          range(end - (window - 1), end))
      assert st['doc_start'][b] == doc_start and st['last_segment'][b] == segments[b, end - 1]


@pytest.mark.parametrize('key,value', [('window', 0), ('num_sinks', -1), ('positions', 'slots'),
                                       ('window', 2.5)])
def test_bad_config_values_name_their_key(key, value):
  with pytest.raises(ConfigError) as error:
    sinks_config(**{key: value})
  assert error.value.key == f'model.streaming_sinks.{key}'
  assert len(str(error.value).splitlines()) == 1


def test_good_settings_reach_the_layer():
  config = sinks_config(num_sinks=0, window=1, positions='original')
  module = attention_layer(config, jnp.float32)
  assert isinstance(module, StreamingSinkAttention)
  assert (module.config.num_sinks, module.config.window, module.config.positions) == (
      0, 1, 'original')
  state = StreamingSinkAttention.init_state(config.streaming_sinks, SharedSettings.of(config), B)
  assert state['sinks'].capacity == 0 and state['window'].capacity == 0


def test_old_flat_names_move_to_the_streaming_sinks_section():
  model, moved = migrate_flat_model({'attention': 'streaming_sinks', 'num_sinks': 2,
                                     'sink_window': 64, 'sink_positions': 'original'})
  assert model['streaming_sinks'] == dict(num_sinks=2, window=64, positions='original')
  assert ('sink_window', 'streaming_sinks.window') in moved
  # num_sinks is also Attendre's (its sink policy): it goes to the variant the model uses.
  assert migrate_flat_model({'attention': 'attendre', 'num_sinks': 2})[0]['attendre'] == {
      'num_sinks': 2}


@pytest.mark.slow  # a train.py smoke run; the layer tests cover the variant
def test_tiny_training_run(tmp_path):
  config = tiny_config(attention='streaming_sinks', streaming_sinks=dict(num_sinks=2, window=6))
  config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
  state, metrics = train(config, str(tmp_path))
  assert int(state.step) == 2 and np.isfinite(metrics['loss'])
  assert 0 < metrics['grad_norm'] < np.inf
  # The streams continue across steps: every layer carries its sinks and a full window.
  for memory in state.memory:
    assert np.asarray(memory['window'].valid).all() and np.asarray(memory['sinks'].valid).any()

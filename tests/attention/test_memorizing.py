"""Memorizing Transformer attention against a float64 python reference.

The reference does not use the layer's memory at all: for query t of chunk
c (first position cs) it lists the past tokens the memory must hold (the
`memorizing.memory_size` positions before cs, same document), takes per head the
top-k of them by q.k with plain numpy sorting, and combines the softmax over
them with the local attention (RoPE over the `mem_len` cache and the chunk,
causal, same document) by the configured gate.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.memorizing import MemorizingAttention
from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.attention.vanilla.attention import VanillaAttention
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.model_config import resolve_model
from tests.support.position_references import numpy_rotate
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config
from train import train

B, C, NUM_CHUNKS, D, H, HD = 2, 4, 4, 16, 2, 8
T = C * NUM_CHUNKS
DOC_STARTS = ([0, 6], [0, 8])     # row 0: a document starting mid-chunk; row 1: at a chunk start


def stream_segments():
  segments = np.zeros((B, T), np.int32)
  for row, starts in enumerate(DOC_STARTS):
    for start in starts[1:]:
      segments[row, start:] += 1
  return segments


def softmax(scores):
  w = np.exp(scores - scores.max())
  return w / w.sum()


def reference_outputs(params, x, segments, *, mem_len, memory_size, top_k, gate, cap=-1,
                      normalize=False):
  """Loop over rows, queries and heads; float64."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  q_raw = np.einsum('btd,dhe->bthe', x, p['query']['kernel'])
  k_raw = np.einsum('btd,dhe->bthe', x, p['key']['kernel'])
  v_all = np.einsum('btd,dhe->bthe', x, p['value']['kernel'])
  if normalize:
    q_raw = q_raw / np.linalg.norm(q_raw, axis=-1, keepdims=True)
    k_raw = k_raw / np.linalg.norm(k_raw, axis=-1, keepdims=True)
  scale = p['qk_scale'] if normalize else np.full(H, 1 / np.sqrt(HD))
  g = {'learned': 1 / (1 + np.exp(-p.get('knn_gate', np.zeros(H)))), 'memory_only': np.ones(H),
       'joint': None}[gate]
  out = np.zeros((B, T, H, HD))
  for b in range(B):
    for t in range(T):
      cs = t - t % C
      same = lambda j: segments[b, j] == segments[b, t]
      local = [j for j in range(max(cs - mem_len, 0), t + 1) if same(j)]
      past = [j for j in range(max(cs - memory_size, 0), cs) if same(j)]
      for h in range(H):
        def rotary_logit(j):
          distance = t - j if cap < 0 else min(t - j, cap)
          rotated_q = numpy_rotate(q_raw[b:b + 1, None, t, h:h + 1], np.array([[distance]]))
          return float(rotated_q.ravel() @ k_raw[b, j, h]) * scale[h]
        local_logits = np.array([rotary_logit(j) for j in local])
        retrieved = sorted(past, key=lambda j: -(q_raw[b, t, h] @ k_raw[b, j, h]))[:top_k]
        mem_logits = np.array([q_raw[b, t, h] @ k_raw[b, j, h] * scale[h] for j in retrieved])
        local_out = softmax(local_logits) @ v_all[b, local, h]
        if gate == 'joint':
          w = softmax(np.concatenate([local_logits, mem_logits]))
          out[b, t, h] = w @ v_all[b, local + retrieved, h]
        elif retrieved:
          mem_out = softmax(mem_logits) @ v_all[b, retrieved, h]
          out[b, t, h] = g[h] * mem_out + (1 - g[h]) * local_out
        else:
          out[b, t, h] = local_out
  return np.einsum('bthe,hed->btd', out, p['out']['kernel'])


def layer_config(mem_len=0, **memorizing):
  """A tiny memorizing model; `memorizing` are keys of `model.memorizing`."""
  return tiny_model_config(attention='memorizing', d_model=D, num_heads=H, head_dim=HD,
                           mem_len=mem_len, memorizing=memorizing)


def chunk_context(c, segments):
  positions = np.tile(np.arange(c * C, (c + 1) * C, dtype=np.int32), (B, 1))
  reset = np.array([c * C in starts for starts in DOC_STARTS])
  return AttentionContext(positions=jnp.asarray(positions),
                          segment_ids=jnp.asarray(segments[:, c * C:(c + 1) * C]),
                          reset=jnp.asarray(reset), valid=jnp.ones((B, C), bool))


def run_stream(config, params, x, segments):
  module = attention_layer(config, jnp.float32)
  apply = jax.jit(module.apply)
  state = attention_state(config, B)
  outputs = []
  for c in range(NUM_CHUNKS):
    y, state, aux = apply({'params': params}, x[:, c * C:(c + 1) * C], state,
                          chunk_context(c, segments))
    outputs.append(np.asarray(y))
  return np.concatenate(outputs, axis=1), state, aux


@functools.lru_cache(maxsize=None)
def vanilla_params():
  """query/key/value/out, shared by every case (the layer uses vanilla's names)."""
  shared = shared_settings(num_heads=H, head_dim=HD, d_model=D)
  module = VanillaAttention(shared=shared)
  ctx = chunk_context(0, stream_segments())
  state = VanillaAttention.init_state(None, shared, B)
  return jax.jit(module.init)(jax.random.PRNGKey(0), random_inputs()[:, :C], state, ctx)['params']


def random_inputs(seed=1):
  return jax.random.normal(jax.random.PRNGKey(seed), (B, T, D))


def params_for(gate, normalize=False):
  params = dict(vanilla_params())
  if gate == 'learned':
    params['knn_gate'] = jnp.array([0.7, -1.2])
  if normalize:
    params['qk_scale'] = jnp.array([5.0, 9.0])
  return params


CASES = {
    # The check: memory holds the whole past, k >= memory size, memory only:
    # dense attention over every past key of the document.
    'whole_past_memory_only': dict(mem_len=0, memory_size=T, top_k=T, gate='memory_only'),
    'learned_gate_topk_and_cache': dict(mem_len=3, memory_size=6, top_k=3, gate='learned'),
    'joint_capped_rope': dict(mem_len=2, memory_size=8, top_k=5, gate='joint',
                              rope_max_distance=2),
    'normalized_qk': dict(mem_len=0, memory_size=5, top_k=2, gate='learned', normalize_qk=True),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_matches_reference(case):
  settings = CASES[case]
  config = layer_config(**settings)
  normalize = settings.get('normalize_qk', False)
  params = params_for(settings['gate'], normalize)
  x = random_inputs()
  segments = stream_segments()
  got, _, aux = run_stream(config, params, x, segments)
  expected = reference_outputs(params, np.asarray(x, np.float64), segments,
                               mem_len=settings['mem_len'], memory_size=settings['memory_size'],
                               top_k=settings['top_k'], gate=settings['gate'],
                               cap=settings.get('rope_max_distance', -1), normalize=normalize)
  np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)
  assert set(aux) >= {'knn_memory_fill'} and all(a.shape == () for a in aux.values())


def test_document_does_not_depend_on_previous_document():
  """Changing the first document of each row changes nothing in the second."""
  config = layer_config(**CASES['learned_gate_topk_and_cache'])
  params = params_for('learned')
  segments = stream_segments()
  x = random_inputs()
  other = np.array(x)
  for row, starts in enumerate(DOC_STARTS):
    other[row, :starts[1]] = np.asarray(random_inputs(seed=5))[row, :starts[1]]
  first, _, _ = run_stream(config, params, x, segments)
  second, _, _ = run_stream(config, params, jnp.asarray(other), segments)
  for row, starts in enumerate(DOC_STARTS):
    np.testing.assert_allclose(first[row, starts[1]:], second[row, starts[1]:], rtol=1e-6, atol=1e-6)
    assert not np.allclose(first[row, :starts[1]], second[row, :starts[1]])


def test_memory_keeps_the_most_recent_past_positions():
  config = layer_config(mem_len=0, memory_size=6, top_k=2, gate='joint')
  _, state, _ = run_stream(config, params_for('joint'), random_inputs(), stream_segments())
  memory = state['knn']
  for row in range(B):
    kept = sorted(np.asarray(memory.positions[row])[np.asarray(memory.valid[row])])
    assert kept == list(range(T - 6, T))


def test_memory_is_stop_gradient():
  """With every query of chunk 2 reading the memory and the gate at memory
  only, chunk 2's output depends on the key/value kernels only through the
  memory written by chunk 1: their gradients must be exactly zero."""
  config = layer_config(mem_len=0, memory_size=8, top_k=3, gate='memory_only')
  module = attention_layer(config, jnp.float32)
  segments = np.zeros((B, T), np.int32)
  ctx0, ctx1 = chunk_context(0, segments), chunk_context(1, segments)
  x = random_inputs()

  def second_chunk_output(params):
    state = attention_state(config, B)
    _, state, _ = module.apply({'params': params}, x[:, :C], state, ctx0)
    y, _, _ = module.apply({'params': params}, x[:, C:2 * C], state, ctx1)
    return jnp.sum(y ** 2)
  grads = nn.meta.unbox(jax.jit(jax.grad(second_chunk_output))(vanilla_params()))
  for name in ('key', 'value'):
    assert float(jnp.abs(grads[name]['kernel']).max()) == 0.0
  for name in ('query', 'out'):
    assert float(jnp.abs(grads[name]['kernel']).max()) > 0.0


def test_vanilla_checkpoint_runs_as_memorizing_at_eval_time():
  """Gates without parameters load vanilla's parameters; with an empty memory
  the output is vanilla's."""
  params = vanilla_params()
  ctx = chunk_context(0, stream_segments())
  x = random_inputs()[:, :C]
  shared = shared_settings(num_heads=H, head_dim=HD, d_model=D)
  vanilla = VanillaAttention(shared=shared)
  expected, _, _ = jax.jit(vanilla.apply)({'params': params}, x,
                                          VanillaAttention.init_state(None, shared, B), ctx)
  for gate in ('joint', 'memory_only', 'fixed'):
    config = layer_config(mem_len=0, memory_size=8, top_k=4, gate=gate)
    module = attention_layer(config, jnp.float32)
    state = attention_state(config, B)
    fresh = jax.eval_shape(module.init, jax.random.PRNGKey(3), x, state, ctx)['params']
    assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(params)
    y, _, _ = jax.jit(module.apply)({'params': params}, x, state, ctx)
    np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-6)


BAD_SETTINGS = [(dict(memory_size=0), 'memory_size'), (dict(top_k=0), 'top_k'),
                (dict(method='faiss'), 'method'),
                (dict(method='approx', recall_target=1.5), 'recall_target'),
                (dict(recall_target=0.9), 'recall_target'),     # read only by method='approx'
                (dict(gate='sometimes'), 'gate'),
                (dict(gate='fixed', gate_value=1.5), 'gate_value'),
                (dict(gate='learned', gate_value=0.3), 'gate_value'),  # read only by 'fixed'
                (dict(normalize_qk=True, qk_scale_init=0.0), 'qk_scale_init'),
                (dict(qk_scale_init=8.0), 'qk_scale_init'),     # read only with normalize_qk
                (dict(rope_max_distance=-2), 'rope_max_distance'),
                (dict(top_k='many'), 'top_k')]


@pytest.mark.parametrize('settings,key', BAD_SETTINGS, ids=[str(s) for s, _ in BAD_SETTINGS])
def test_bad_config_values_name_their_key(settings, key):
  with pytest.raises(ConfigError) as error:
    layer_config(**settings)
  assert error.value.key == f'model.memorizing.{key}'
  assert len(str(error.value).splitlines()) == 1


def test_good_settings_reach_the_layer():
  config = layer_config(mem_len=4, memory_size=64, top_k=8, method='approx', recall_target=0.9,
                        gate='fixed', gate_value=0.25, normalize_qk=True, qk_scale_init=8.0,
                        rope_max_distance=7)
  module = attention_layer(config, jnp.float32)
  assert isinstance(module, MemorizingAttention)
  section = module.config
  assert (section.top_k, section.method, section.recall_target, section.gate, section.gate_value,
          section.normalize_qk, section.qk_scale_init, section.rope_max_distance) == (
              8, 'approx', 0.9, 'fixed', 0.25, True, 8.0, 7)
  state = attention_state(config, B)
  assert state['knn'].capacity == 64 and state['local'].capacity == 4


def test_old_flat_names_move_to_the_memorizing_section():
  model, moved = migrate_flat_model({
      'attention': 'vanilla', 'layer_schedule': {'attention': 'vanilla,memorizing'},
      'knn_memory_size': 2048, 'knn_top_k': 16, 'knn_gate': 'joint', 'knn_normalize_qk': True,
      'knn_qk_scale_init': 8.0, 'rope_max_distance': 5, 'mem_len': 64})
  assert model['memorizing'] == dict(memory_size=2048, top_k=16, gate='joint',
                                     normalize_qk=True, qk_scale_init=8.0, rope_max_distance=5)
  assert ('knn_top_k', 'memorizing.top_k') in moved and model['mem_len'] == 64
  assert resolve_model(dict(model, num_layers=2))['memorizing']['top_k'] == 16


@pytest.mark.slow
def test_tiny_training_run_with_a_knn_layer(tmp_path):
  """Two training steps of a 2-layer model whose second layer has the kNN memory."""
  config = tiny_config(layer_schedule={'attention': 'vanilla,memorizing'},
                       memorizing=dict(memory_size=32, top_k=4, normalize_qk=True))
  config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
  state, metrics = train(config, str(tmp_path))
  assert int(state.step) == 2 and np.isfinite(metrics['loss'])
  assert 0 < metrics['aux/knn_memory_fill'] <= 1 and 0 < metrics['aux/knn_gate'] < 1

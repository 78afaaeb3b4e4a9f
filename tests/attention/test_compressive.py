"""Compressive Transformer attention and compression functions.

References, all independent of the code under test: a Python loop over
groups and window members for the compression functions; a float64 loop
over (query, key) pairs with an explicit R[i - j] lookup for the attention
over [compressed memory; memory; chunk]; Transformer-XL with a memory of
n_m + n_cm for rate 1 and identity compression.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from longformer_jax.attention.compressive import (CompressiveAttention, CompressiveConfig,
                                                   CompressiveMemory)
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer
from longformer_jax.attention.xl import XLAttention, XLConfig
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.memory import compression, fifo
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.config.migration import migrate_flat_model
from tests.support.tiny_models import (context_of, shared_settings, stream_batch, tiny_config,
                                       tiny_model_config)

B, C, D, H, HD = 2, 4, 16, 2, 8
N_M, N_CM = 6, 4


def numpy_params(params):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))


def numpy_sinusoid(distance: float, dim: int) -> np.ndarray:
  inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2) / dim))
  return np.concatenate([np.sin(distance * inv_freq), np.cos(distance * inv_freq)])


# ---- compression functions -------------------------------------------------

def reference_compress(function, values, pos, seg, valid, usage, rate, kernel, dilation, conv):
  """Python loop over groups: returns (values, positions, segments, valid) of the outputs."""
  n_s = values.shape[1]
  n_out = n_s // rate
  out_v = np.zeros((values.shape[0], n_out, values.shape[2]))
  out_p = np.zeros((values.shape[0], n_out), int)
  out_s = np.zeros((values.shape[0], n_out), int)
  out_ok = np.zeros((values.shape[0], n_out), bool)
  for b in range(values.shape[0]):
    if function == 'most_used':
      ranked = sorted((s for s in range(n_s) if valid[b, s]), key=lambda s: -usage[b, s])
      for j, s in enumerate(sorted(ranked[:n_out])):
        out_v[b, j], out_p[b, j], out_s[b, j], out_ok[b, j] = values[b, s], pos[b, s], seg[b, s], True
      continue
    for j in range(n_out):
      end = n_s - 1 - (n_out - 1 - j) * rate
      group = list(range(end - rate + 1, end + 1))
      valid_members = [s for s in group if valid[b, s]]
      if not valid_members:
        continue
      anchor = max(valid_members)
      out_p[b, j], out_s[b, j], out_ok[b, j] = pos[b, anchor], seg[b, anchor], True
      if function == 'dilated_conv':
        window = [end - (kernel - 1 - i) * dilation for i in range(kernel)]
      else:
        window = group
      members = [(i, s) for i, s in enumerate(window)
                 if s >= 0 and valid[b, s] and seg[b, s] == seg[b, anchor]]
      if function == 'max_pool':
        out_v[b, j] = np.max([values[b, s] for _, s in members], axis=0)
      elif function == 'mean_pool':
        out_v[b, j] = np.mean([values[b, s] for _, s in members], axis=0)
      else:
        out_v[b, j] = conv['bias'] + sum(values[b, s] @ conv['kernel'][i] for i, s in members)
  return out_v, out_p, out_s, out_ok


def random_evicted(n_s: int, seed: int):
  rng = np.random.default_rng(seed)
  values = rng.normal(size=(B, n_s, D)).astype(np.float32)
  positions = np.tile(np.arange(100, 100 + n_s, dtype=np.int32), (B, 1))
  segments = np.zeros((B, n_s), np.int32)
  segments[1, 7:] = 1                                   # a document starts inside a group
  valid = rng.random((B, n_s)) > 0.25
  valid[0, :5] = False                                  # a whole group invalid
  usage = rng.random((B, n_s)).astype(np.float32)
  return fifo.FifoMemory(values=jnp.asarray(values), positions=jnp.asarray(positions),
                         segment_ids=jnp.asarray(segments), valid=jnp.asarray(valid)), usage


@pytest.mark.parametrize('function', compression.COMPRESSION_FUNCTIONS)
@pytest.mark.parametrize('n_s,rate', [(12, 3), (12, 5)])
def test_compression_matches_python_loop(function, n_s, rate):
  evicted, usage = random_evicted(n_s, seed=n_s + rate)
  compressor = compression.Compressor(function, rate, D, kernel=3, dilation=2)
  params = jax.jit(compressor.init)(jax.random.PRNGKey(0), evicted, jnp.asarray(usage))
  out = jax.jit(compressor.apply)(params, evicted, jnp.asarray(usage))
  conv = numpy_params(params['params'])['conv'] if function in compression.LEARNED else None
  values, positions, segments, valid = reference_compress(
      function, np.asarray(evicted.values, np.float64), np.asarray(evicted.positions),
      np.asarray(evicted.segment_ids), np.asarray(evicted.valid), usage, rate, 3, 2, conv)
  np.testing.assert_array_equal(np.asarray(out.valid), valid)
  np.testing.assert_array_equal(np.asarray(out.positions)[valid], positions[valid])
  np.testing.assert_array_equal(np.asarray(out.segment_ids)[valid], segments[valid])
  np.testing.assert_allclose(np.asarray(out.values)[valid], values[valid], rtol=1e-5, atol=1e-5)


# ---- the attention layer against a float64 loop ----------------------------

def reference_attention(p, x, keys_src, k_pos, k_seg, k_valid, q_pos, q_seg):
  """Dense XL attention over arbitrary keys; returns (output, weights [b, h, q, k])."""
  q = np.einsum('bqd,dhe->bqhe', x, p['query']['kernel'])
  k = np.einsum('bkd,dhe->bkhe', keys_src, p['key']['kernel'])
  v = np.einsum('bkd,dhe->bkhe', keys_src, p['value']['kernel'])
  u, vb = p['content_bias'], p['position_bias']
  out = np.zeros(q.shape)
  weights = np.zeros((x.shape[0], H, x.shape[1], keys_src.shape[1]))
  for b in range(x.shape[0]):
    for i in range(x.shape[1]):
      for h in range(H):
        allowed = [j for j in range(keys_src.shape[1])
                   if k_valid[b, j] and k_seg[b, j] == q_seg[b, i] and k_pos[b, j] <= q_pos[b, i]]
        scores = []
        for j in allowed:
          r = numpy_sinusoid(q_pos[b, i] - k_pos[b, j], D) @ p['relative_key']['kernel'][:, h]
          scores.append(((q[b, i, h] + u[h]) @ k[b, j, h] + (q[b, i, h] + vb[h]) @ r) / np.sqrt(HD))
        w = np.exp(np.array(scores) - max(scores))
        w /= w.sum()
        weights[b, h, i, allowed] = w
        out[b, i, h] = sum(wj * v[b, j, h] for wj, j in zip(w, allowed))
  return np.einsum('bqhe,hed->bqd', out, p['out']['kernel']), weights


def reference_content_attention(p, x, src, k_pos, k_seg, k_valid, q_pos, q_seg):
  q = np.einsum('bqd,dhe->bqhe', x, p['query']['kernel'])
  k = np.einsum('bkd,dhe->bkhe', src, p['key']['kernel'])
  v = np.einsum('bkd,dhe->bkhe', src, p['value']['kernel'])
  out = np.zeros(q.shape)
  for b in range(x.shape[0]):
    for i in range(x.shape[1]):
      allowed = [j for j in range(src.shape[1])
                 if k_valid[b, j] and k_seg[b, j] == q_seg[b, i] and k_pos[b, j] <= q_pos[b, i]]
      for h in range(H):
        if not allowed:
          continue
        s = np.array([q[b, i, h] @ k[b, j, h] / np.sqrt(HD) for j in allowed])
        w = np.exp(s - s.max())
        out[b, i, h] = (w / w.sum()) @ v[b, allowed, h]
  return out


def layer_inputs():
  """A chunk at positions 20..23 with a full memory and compressed entries at group anchors."""
  rng = np.random.default_rng(7)
  p0 = 20
  q_pos = np.tile(np.arange(p0, p0 + C, dtype=np.int32), (B, 1))
  q_seg = np.zeros((B, C), np.int32)
  q_seg[1, 2:] = 1                                      # row 1: a new document mid-chunk
  mem_pos = np.tile(np.arange(p0 - N_M, p0, dtype=np.int32), (B, 1))
  mem_valid = np.ones((B, N_M), bool)
  mem_valid[1, 0] = False
  cm_pos = np.tile(np.array([p0 - N_M - 7, p0 - N_M - 5, p0 - N_M - 3, p0 - N_M - 1], np.int32),
                   (B, 1))
  cm_valid = np.array([[False, True, True, True], [True, True, False, True]])
  state = CompressiveMemory(
      memory=fifo.FifoMemory(values=jnp.asarray(rng.normal(size=(B, N_M, D)), jnp.float32),
                             positions=jnp.asarray(mem_pos), segment_ids=jnp.zeros((B, N_M), jnp.int32),
                             valid=jnp.asarray(mem_valid)),
      compressed=fifo.FifoMemory(values=jnp.asarray(rng.normal(size=(B, N_CM, D)), jnp.float32),
                                 positions=jnp.asarray(cm_pos),
                                 segment_ids=jnp.zeros((B, N_CM), jnp.int32),
                                 valid=jnp.asarray(cm_valid)),
      usage=jnp.asarray(rng.random((B, N_M)), jnp.float32),
      usage_count=jnp.asarray(rng.integers(1, 4, (B, N_M)), jnp.float32))
  ctx = AttentionContext(positions=jnp.asarray(q_pos), segment_ids=jnp.asarray(q_seg),
                         reset=jnp.zeros((B,), bool), valid=jnp.ones((B, C), bool))
  x = jnp.asarray(rng.normal(size=(B, C, D)), jnp.float32)
  return x, state, ctx


def test_layer_matches_float64_reference():
  module = CompressiveAttention(config=CompressiveConfig(function='conv', rate=2),
                                shared=shared_settings(num_heads=H, head_dim=HD, d_model=D))
  x, state, ctx = layer_inputs()
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, state, ctx)['params']
  params = dict(params, content_bias=jax.random.normal(jax.random.PRNGKey(3), (H, HD)),
                position_bias=jax.random.normal(jax.random.PRNGKey(4), (H, HD)))
  y, new_state, aux = jax.jit(module.apply)({'params': params}, x, state, ctx)

  p = numpy_params(params)
  f64 = lambda a: np.asarray(a, np.float64)
  cat = lambda *a: np.concatenate([np.asarray(t) for t in a], axis=1)
  mem, cm = state.memory, state.compressed
  keys_src = cat(f64(cm.values), f64(mem.values), f64(x))
  k_pos = cat(cm.positions, mem.positions, ctx.positions)
  k_seg = cat(cm.segment_ids, mem.segment_ids, ctx.segment_ids)
  k_valid = cat(cm.valid, mem.valid, ctx.valid)
  expected, weights = reference_attention(p, f64(x), keys_src, k_pos, k_seg, k_valid,
                                          np.asarray(ctx.positions), np.asarray(ctx.segment_ids))
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)

  # Memory: the last N_M of [memory; chunk]; evicted: the first C memory slots.
  np.testing.assert_array_equal(np.asarray(new_state.memory.positions),
                                cat(mem.positions, ctx.positions)[:, C:])
  # Usage: attention averaged over heads and queries, accumulated per chunk.
  received = weights.mean(axis=1).mean(axis=1)[:, N_CM:]
  usage = cat(state.usage, np.zeros((B, C))) + received
  count = cat(state.usage_count, np.zeros((B, C))) + 1
  np.testing.assert_allclose(np.asarray(new_state.usage), usage[:, C:], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(new_state.usage_count), count[:, C:])

  # Compressed memory: the two oldest fall out, two compressed groups come in.
  ev = slice(0, C)
  values, positions, _, valid = reference_compress(
      'conv', f64(mem.values)[:, ev], np.asarray(mem.positions)[:, ev],
      np.asarray(mem.segment_ids)[:, ev], np.asarray(mem.valid)[:, ev], None, 2, 2, 1,
      p['compression']['conv'])
  new_cm = new_state.compressed
  np.testing.assert_array_equal(np.asarray(new_cm.valid), cat(cm.valid[:, 2:], valid))
  np.testing.assert_array_equal(np.asarray(new_cm.positions)[:, 2:][valid], positions[valid])
  np.testing.assert_allclose(np.asarray(new_cm.values)[:, 2:][valid], values[valid],
                             rtol=1e-5, atol=1e-5)

  # Reconstruction loss: content attention over old memories vs their compression.
  q_args = (np.asarray(ctx.positions), np.asarray(ctx.segment_ids))
  old = reference_content_attention(p, f64(x), f64(mem.values)[:, ev], np.asarray(mem.positions)[:, ev],
                                    np.asarray(mem.segment_ids)[:, ev], np.asarray(mem.valid)[:, ev],
                                    *q_args)
  new = reference_content_attention(p, f64(x), values, positions, np.zeros_like(positions), valid,
                                    *q_args)
  np.testing.assert_allclose(float(aux['reconstruction_loss']), np.mean((old - new) ** 2),
                             rtol=1e-4)
  assert float(aux['reconstruction_loss']) > 0


# ---- rate 1, identity compression == XL with memory n_m + n_cm -------------

def stream_contexts(num_chunks: int):
  """Row 0: documents of 6 tokens (boundaries inside chunks); row 1: of 8 (resets)."""
  positions = np.tile(np.arange(num_chunks * C, dtype=np.int32), (B, 1))
  segments = np.stack([positions[0] // 6, positions[1] // 8]).astype(np.int32)
  starts = np.stack([positions[0] % 6 == 0, positions[1] % 8 == 0])
  valid = np.ones_like(positions, bool)
  valid[0, -1] = False                                  # padding at the end of row 0
  return [AttentionContext(positions=jnp.asarray(positions[:, s]),
                           segment_ids=jnp.asarray(segments[:, s]),
                           reset=jnp.asarray(starts[:, s.start]), valid=jnp.asarray(valid[:, s]))
          for s in (slice(i * C, (i + 1) * C) for i in range(num_chunks))]


@pytest.mark.parametrize('function', ['mean_pool', 'conv'])
def test_rate_one_identity_compression_equals_xl(function):
  num_chunks = 6
  xs = jax.random.normal(jax.random.PRNGKey(5), (num_chunks, B, C, D))
  ctxs = stream_contexts(num_chunks)
  shared = shared_settings(num_heads=H, head_dim=HD, d_model=D)
  module = CompressiveAttention(config=CompressiveConfig(function=function, rate=1), shared=shared)
  xl = XLAttention(config=XLConfig(relative_impl='shift'), shared=shared)
  state = CompressiveMemory(memory=fifo.create(B, N_M, (D,)), compressed=fifo.create(B, N_CM, (D,)),
                            usage=jnp.zeros((B, N_M)), usage_count=jnp.zeros((B, N_M)))
  xl_state = fifo.create(B, N_M + N_CM, (D,))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), xs[0], state, ctxs[0])['params']
  params = dict(params, content_bias=jax.random.normal(jax.random.PRNGKey(3), (H, HD)),
                position_bias=jax.random.normal(jax.random.PRNGKey(4), (H, HD)))
  if function == 'conv':     # the identity convolution
    params['compression'] = {'conv': {'kernel': jnp.eye(D)[None], 'bias': jnp.zeros(D)}}
  xl_params = {k: v for k, v in params.items() if k != 'compression'}
  apply, xl_apply = jax.jit(module.apply), jax.jit(xl.apply)
  for x, ctx in zip(xs, ctxs):
    y, state, _ = apply({'params': params}, x, state, ctx)
    y_xl, xl_state, _ = xl_apply({'params': xl_params}, x, xl_state, ctx)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_xl), rtol=1e-5, atol=1e-5)
  assert np.asarray(state.compressed.valid).any()       # the compressed memory was used


def test_reconstruction_loss_is_zero_exactly_when_the_compression_reproduces_the_memories():
  """Rate 1 and the identity convolution: the compressed slots are the evicted memories, so
  attention over them reproduces attention over the memories (loss 0); a convolution that
  halves them does not (loss > 0)."""
  num_chunks = 5
  xs = jax.random.normal(jax.random.PRNGKey(5), (num_chunks, B, C, D))
  ctxs = stream_contexts(num_chunks)
  module = CompressiveAttention(config=CompressiveConfig(function='conv', rate=1),
                                shared=shared_settings(num_heads=H, head_dim=HD, d_model=D))
  state0 = CompressiveMemory(memory=fifo.create(B, N_M, (D,)), compressed=fifo.create(B, N_CM, (D,)),
                             usage=jnp.zeros((B, N_M)), usage_count=jnp.zeros((B, N_M)))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), xs[0], state0, ctxs[0])['params']
  apply = jax.jit(module.apply)
  for scale, exact in ((1.0, True), (0.5, False)):
    params['compression'] = {'conv': {'kernel': scale * jnp.eye(D)[None], 'bias': jnp.zeros(D)}}
    state, losses = state0, []
    for x, ctx in zip(xs, ctxs):
      _, state, aux = apply({'params': params}, x, state, ctx)
      losses.append(float(aux['reconstruction_loss']))
    assert np.asarray(state.compressed.valid).any()
    if exact:
      assert max(losses) < 1e-10, losses
    else:
      assert max(losses) > 1e-4, losses


# ---- gradients: the reconstruction loss trains only the compression network --

def compression_leaf(path) -> bool:
  return any(getattr(k, 'key', None) == 'compression' for k in path)


def test_reconstruction_loss_reaches_only_the_compression_network():
  config = tiny_model_config(attention='compressive', mem_len=8,
                             compressive={'function': 'conv', 'rate': 2, 'compressed_mem_len': 4})
  model = DecoderLM(config)
  batch = stream_batch(2, 16, seed=1)
  chunks = [jax.tree_util.tree_map(lambda a: a[:, s], batch) for s in (slice(0, 8), slice(8, 16))]
  states = DecoderLM.init_state(config, 2)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), chunks[0]['inputs'], states,
                               context_of(chunks[0]))['params']
  readout = jax.random.normal(jax.random.PRNGKey(9), (2, 8, config.vocab_size))

  @jax.jit
  @jax.grad
  def grad_of_second_chunk(params, mix):
    """mix (1, 0): the reconstruction losses; (0, 1): a readout of the logits."""
    _, s, _ = model.apply({'params': params}, chunks[0]['inputs'], states, context_of(chunks[0]))
    logits, _, aux = model.apply({'params': params}, chunks[1]['inputs'], s, context_of(chunks[1]))
    return mix[0] * sum(a['reconstruction_loss'] for a in aux) + mix[1] * jnp.sum(logits * readout)

  recon_grads = grad_of_second_chunk(params, jnp.array([1.0, 0.0]))
  lm_grads = grad_of_second_chunk(params, jnp.array([0.0, 1.0]))
  leaves = jax.tree_util.tree_leaves_with_path(nn.meta.unbox(recon_grads))
  lm_leaves = dict(jax.tree_util.tree_leaves_with_path(nn.meta.unbox(lm_grads)))
  assert sum(compression_leaf(path) for path, _ in leaves) == 4   # kernel, bias x 2 layers
  for path, grad in leaves:
    name = jax.tree_util.keystr(path)
    if compression_leaf(path):
      assert np.abs(np.asarray(grad)).max() > 0, name
      assert np.abs(np.asarray(lm_leaves[path])).max() == 0, name     # LM loss never trains it
    else:
      assert np.abs(np.asarray(grad)).max() == 0, name


# ---- config section ---------------------------------------------------------

@pytest.mark.parametrize('settings,key', [
    ({'function': 'avg_pool'}, 'function'),
    ({'rate': 0}, 'rate'),
    ({'compressed_mem_len': -1}, 'compressed_mem_len'),
    ({'function': 'dilated_conv', 'kernel': -1}, 'kernel'),
    ({'function': 'dilated_conv', 'dilation': 0}, 'dilation'),
    ({'function': 'conv', 'kernel': 4}, 'kernel'),         # read by dilated_conv only
    ({'function': 'max_pool', 'dilation': 3}, 'dilation'),
    ({'clamp_len': 0}, 'clamp_len'),
    # tiny_config's chunks have 8 tokens: a rate of 9 would compress them into nothing.
    ({'rate': 9, 'compressed_mem_len': 4}, 'rate'),
])
def test_bad_settings_name_their_config_key(settings, key):
  with pytest.raises(ConfigError, match=rf'model\.compressive\.{key}: '):
    tiny_config(attention='compressive', compressive=settings)


def test_rate_may_exceed_the_chunk_without_a_compressed_memory():
  config = tiny_config(attention='compressive', compressive={'rate': 9})
  assert config.model.compressive.rate == 9 and config.model.compressive.compressed_mem_len == 0


def test_rate_is_checked_against_the_evaluation_chunk_length():
  values = {'model': {'attention': 'compressive', 'mem_len': 16,
                      'compressive': {'rate': 32, 'compressed_mem_len': 8}},
            'data': {'chunk_len': 64}, 'eval': {'chunk_len': 16}}
  with pytest.raises(ConfigError, match=r'model\.compressive\.rate: 32 must be <= every chunk '
                                        r'length \(16\)'):
    resolve_config(values)


def test_old_flat_names_migrate_to_the_section():
  values, moved = migrate_flat_model({
      'attention': 'compressive', 'compressed_mem_len': 8, 'compression': 'dilated_conv',
      'compression_rate': 2, 'compression_kernel': 3, 'compression_dilation': 2,
      'clamp_len': 5})
  assert values == {'attention': 'compressive', 'compressive': {
      'compressed_mem_len': 8, 'function': 'dilated_conv', 'rate': 2, 'kernel': 3,
      'dilation': 2, 'clamp_len': 5}}
  assert ('compression_rate', 'compressive.rate') in moved


def test_attention_layer_reads_the_section():
  config = tiny_model_config(attention='compressive', compressive={
      'function': 'dilated_conv', 'rate': 2, 'kernel': 3, 'dilation': 4, 'clamp_len': 7})
  module = attention_layer(config, jnp.float32)
  assert isinstance(module, CompressiveAttention)
  assert (module.config.function, module.config.rate, module.config.kernel_length(),
          module.config.dilation, module.relative_settings()) == (
              'dilated_conv', 2, 3, 4, (7, 'gather'))
  # kernel 0 (the default) means the rate.
  default = attention_layer(
      tiny_model_config(attention='compressive', compressive={'rate': 2}), jnp.float32)
  assert default.config.kernel_length() == 2


# ---- end to end ------------------------------------------------------------

@pytest.mark.parametrize('function', ['conv', pytest.param('most_used', marks=pytest.mark.slow)])
def test_tiny_training_reports_reconstruction_loss(tmp_path, function):
  config = tiny_config(attention='compressive',
                       compressive={'function': function, 'rate': 2, 'compressed_mem_len': 8})
  config.model.aux_loss_weights.reconstruction_loss = 1.0
  config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 2
  assert np.isfinite(metrics['loss'])
  assert np.isfinite(metrics['aux/reconstruction_loss'])
  assert 0 < metrics['aux/compressed_memory_occupancy'] <= 1

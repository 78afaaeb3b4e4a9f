"""Expire-Span attention against independent references.

The float64 reference loops over (query, key) pairs: e_i = L sigmoid(w.h_i + b),
m_ti = clamp(1 + (e_i - (t - i)) / R, 0, 1), XL scores with an explicit
R[i - j] lookup, weights m_ti exp(s_ti) / sum_j m_tj exp(s_tj). With spans
larger than every distance the layer must equal Transformer-XL; entries
masked for every query must not change anything.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.expire_span import (ExpireSpanAttention, ExpireSpanConfig,
                                                   soft_expire_mask)
from longformer_jax.attention.registry import attention_layer
from longformer_jax.attention.xl import XLAttention, XLConfig
from longformer_jax.config.errors import ConfigError
from longformer_jax.memory import fifo
from longformer_jax.config.migration import migrate_flat_model
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config

B, C, D, H, HD = 2, 4, 16, 2, 8
CAPACITY, L, R = 8, 12, 4


def numpy_params(params):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))


def numpy_sinusoid(distance: float, dim: int) -> np.ndarray:
  inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2) / dim))
  return np.concatenate([np.sin(distance * inv_freq), np.cos(distance * inv_freq)])


def reference_spans(p, h, pre_div=1.0):
  score = (h / pre_div) @ p['expire_span']['kernel'][:, 0] + p['expire_span_bias']
  return L / (1.0 + np.exp(-score))


def reference_ramp_loss(spans, k_pos, k_seg, k_valid, q_pos, q_seg):
  """The authors' penalty by loops: per row, r_ti = e_i - (t - i) summed over the pairs a
  query reads on the ramp (0 < m_ti < 1), divided by R and the row's queries; rows averaged."""
  rows = []
  for b in range(spans.shape[0]):
    total = 0.0
    for t in range(q_pos.shape[1]):
      for i in range(spans.shape[1]):
        distance = q_pos[b, t] - k_pos[b, i]
        if not k_valid[b, i] or k_seg[b, i] != q_seg[b, t] or distance < 0:
          continue
        m = reference_soft_mask(spans[b, i], q_pos[b, t], k_pos[b, i])
        if 0 < m < 1:
          total += spans[b, i] - distance
    rows.append(total / (R * q_pos.shape[1]))
  return np.mean(rows)


def reference_soft_mask(e, t, i):
  return min(max(1.0 + (e - (t - i)) / R, 0.0), 1.0)


def reference_expire_attention(p, x, keys_src, k_pos, k_seg, k_valid, q_pos, q_seg):
  q = np.einsum('bqd,dhe->bqhe', x, p['query']['kernel'])
  k = np.einsum('bkd,dhe->bkhe', keys_src, p['key']['kernel'])
  v = np.einsum('bkd,dhe->bkhe', keys_src, p['value']['kernel'])
  u, vb = p['content_bias'], p['position_bias']
  spans = reference_spans(p, keys_src)
  out = np.zeros(q.shape)
  for b in range(x.shape[0]):
    for i in range(x.shape[1]):
      for h in range(H):
        weights, keys = [], []
        for j in range(keys_src.shape[1]):
          distance = q_pos[b, i] - k_pos[b, j]
          if not k_valid[b, j] or k_seg[b, j] != q_seg[b, i] or distance < 0:
            continue
          m = reference_soft_mask(spans[b, j], q_pos[b, i], k_pos[b, j])
          r = numpy_sinusoid(distance, D) @ p['relative_key']['kernel'][:, h]
          s = ((q[b, i, h] + u[h]) @ k[b, j, h] + (q[b, i, h] + vb[h]) @ r) / np.sqrt(HD)
          weights.append(m * np.exp(s))
          keys.append(j)
        if weights and sum(weights) > 0:
          out[b, i, h] = sum(w * v[b, j, h] for w, j in zip(weights, keys)) / sum(weights)
  return np.einsum('bqhe,hed->bqd', out, p['out']['kernel']), spans


def test_soft_mask_matches_python_loop():
  rng = np.random.default_rng(0)
  spans = rng.uniform(0, L, (B, 9))
  k_pos = rng.integers(0, 30, (B, 9))
  q_pos = rng.integers(10, 40, (B, 5))
  mask = np.asarray(soft_expire_mask(jnp.asarray(spans, jnp.float32), jnp.asarray(q_pos),
                                     jnp.asarray(k_pos), R))
  for b in range(B):
    for t in range(5):
      for i in range(9):
        expected = reference_soft_mask(spans[b, i], q_pos[b, t], k_pos[b, i])
        np.testing.assert_allclose(mask[b, t, i], expected, atol=1e-6)
  assert ((mask > 0) & (mask < 1)).any() and (mask == 0).any() and (mask == 1).any()


def layer_inputs(far_value_offset: float = 0.0):
  """A chunk at 30..33; memory with gaps, an invalid slot, an entry far in the past (slot 0)."""
  rng = np.random.default_rng(3)
  p0 = 30
  mem_pos = np.array([[p0 - 40, p0 - 15, p0 - 11, p0 - 9, p0 - 6, p0 - 3, p0 - 2, p0 - 1]] * B,
                     np.int32)
  mem_valid = np.ones((B, CAPACITY), bool)
  mem_valid[1, 3] = False
  values = rng.normal(size=(B, CAPACITY, D)).astype(np.float32)
  values[:, 0] += far_value_offset
  q_seg = np.zeros((B, C), np.int32)
  q_seg[1, 3] = 1                                       # row 1: a new document at the last token
  memory = fifo.FifoMemory(values=jnp.asarray(values), positions=jnp.asarray(mem_pos),
                           segment_ids=jnp.zeros((B, CAPACITY), jnp.int32),
                           valid=jnp.asarray(mem_valid))
  ctx = AttentionContext(positions=jnp.tile(jnp.arange(p0, p0 + C, dtype=jnp.int32), (B, 1)),
                         segment_ids=jnp.asarray(q_seg), reset=jnp.zeros((B,), bool),
                         valid=jnp.ones((B, C), bool))
  x = jnp.asarray(rng.normal(size=(B, C, D)), jnp.float32)
  return x, memory, ctx


SHARED = shared_settings(num_heads=H, head_dim=HD, d_model=D)
MODULE = ExpireSpanAttention(config=ExpireSpanConfig(max_span=L, ramp=R), shared=SHARED)


@pytest.fixture(scope='module')
def layer_params():
  x, memory, ctx = layer_inputs()
  params = jax.jit(MODULE.init)(jax.random.PRNGKey(0), x, memory, ctx)['params']
  return dict(params, content_bias=jax.random.normal(jax.random.PRNGKey(3), (H, HD)),
              position_bias=jax.random.normal(jax.random.PRNGKey(4), (H, HD)),
              expire_span=dict(kernel=0.6 * jax.random.normal(jax.random.PRNGKey(5), (D, 1))),
              expire_span_bias=jnp.asarray(0.5))


apply_layer = jax.jit(MODULE.apply)


def test_layer_matches_float64_reference(layer_params):
  x, memory, ctx = layer_inputs()
  y, new_state, aux = apply_layer({'params': layer_params}, x, memory, ctx)
  p = numpy_params(layer_params)
  cat = lambda *a: np.concatenate([np.asarray(t) for t in a], axis=1)
  keys_src = cat(memory.values, x).astype(np.float64)
  k_pos, k_seg = cat(memory.positions, ctx.positions), cat(memory.segment_ids, ctx.segment_ids)
  k_valid = cat(memory.valid, ctx.valid)
  expected, spans = reference_expire_attention(p, np.asarray(x, np.float64), keys_src, k_pos,
                                               k_seg, k_valid, np.asarray(ctx.positions),
                                               np.asarray(ctx.segment_ids))
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(float(aux['expire_span_loss']), spans[:, CAPACITY:].mean(), rtol=1e-5)

  # Kept: valid, of the row's last document, mask > 0 at the next position (34).
  for b in range(B):
    last_segment = np.asarray(ctx.segment_ids)[b, -1]
    kept = sorted(k_pos[b, j] for j in range(k_pos.shape[1])
                  if k_valid[b, j] and k_seg[b, j] == last_segment
                  and reference_soft_mask(spans[b, j], 34, k_pos[b, j]) > 0)[-CAPACITY:]
    valid = np.asarray(new_state.valid[b])
    np.testing.assert_array_equal(np.asarray(new_state.positions[b])[valid], kept)
    assert not valid[:CAPACITY - len(kept)].any()       # free slots first
    for slot in np.flatnonzero(valid):
      j = list(k_pos[b]).index(int(new_state.positions[b, slot]))
      np.testing.assert_array_equal(np.asarray(new_state.values[b, slot]), keys_src[b, j])
  # Row 0 dropped something (memory stays small), and kept chunk tokens.
  assert np.asarray(new_state.valid[0]).sum() < CAPACITY
  assert 0 < float(aux['memory_occupancy']) < 1


def test_pre_division_and_the_authors_ramp_loss_match_their_formulas(layer_params):
  """e_i = L sigmoid(w . h_i / p + b) with p = 8 (outputs and kept entries follow those
  spans), and the 'ramp' penalty against its loop (facebookresearch/transformer-sequential)."""
  x, memory, ctx = layer_inputs()
  module = ExpireSpanAttention(config=ExpireSpanConfig(max_span=L, ramp=R, pre_div=8.0,
                                                       loss='ramp'), shared=SHARED)
  # w scaled by p: the spans, hence the outputs, equal the undivided layer's ...
  scaled = dict(layer_params, expire_span={'kernel': 8.0 * layer_params['expire_span']['kernel']})
  y, state, aux = jax.jit(module.apply)({'params': scaled}, x, memory, ctx)
  y_plain, state_plain, _ = apply_layer({'params': layer_params}, x, memory, ctx)
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_plain), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(state.positions), np.asarray(state_plain.positions))
  # ... and the penalty, a function of the spans, is the loop's on the formula's spans.
  p = numpy_params(scaled)
  cat = lambda *a: np.concatenate([np.asarray(t) for t in a], axis=1)
  keys_src = cat(memory.values, x).astype(np.float64)
  spans = reference_spans(p, keys_src, pre_div=8.0)
  expected = reference_ramp_loss(spans, cat(memory.positions, ctx.positions),
                                 cat(memory.segment_ids, ctx.segment_ids),
                                 cat(memory.valid, ctx.valid), np.asarray(ctx.positions),
                                 np.asarray(ctx.segment_ids))
  assert expected < 0        # r_ti is negative on the ramp; its gradient lowers the spans
  np.testing.assert_allclose(float(aux['expire_span_loss']), expected, rtol=1e-5)
  penalty = jax.jit(jax.grad(
      lambda params: module.apply({'params': params}, x, memory, ctx)[2]['expire_span_loss']))
  assert float(penalty(scaled)['expire_span_bias']) > 0


def test_dropped_entries_never_affect_outputs(layer_params):
  """The entry at position -10 is masked for every query: changing it changes nothing."""
  x, memory, ctx = layer_inputs()
  _, perturbed_memory, _ = layer_inputs(far_value_offset=100.0)
  y, state, _ = apply_layer({'params': layer_params}, x, memory, ctx)
  y2, state2, _ = apply_layer({'params': layer_params}, x, perturbed_memory, ctx)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y2))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                         state, state2)
  assert -10 not in np.asarray(state.positions)[np.asarray(state.valid)]


def test_random_shortening_only_in_training(layer_params):
  x, memory, ctx = layer_inputs()
  shortening = ExpireSpanAttention(config=ExpireSpanConfig(max_span=L, ramp=R, shorten=True),
                                   shared=SHARED)
  y, _, aux = apply_layer({'params': layer_params}, x, memory, ctx)
  apply_shortening = jax.jit(shortening.apply)
  y_eval, _, _ = apply_shortening({'params': layer_params}, x, memory, ctx)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_eval))
  train_ctx = ctx.replace(deterministic=False)
  y_train, _, aux_train = apply_shortening({'params': layer_params}, x, memory, train_ctx,
                                            rngs={'dropout': jax.random.PRNGKey(0)})
  assert np.abs(np.asarray(y_train) - np.asarray(y)).max() > 1e-3
  np.testing.assert_allclose(float(aux_train['expire_span_loss']), float(aux['expire_span_loss']))


def test_span_parameters_get_gradients(layer_params):
  x, memory, ctx = layer_inputs()
  readout = jax.random.normal(jax.random.PRNGKey(2), (B, C, D))

  @jax.jit
  def grads(params):
    def objective(params):
      y, _, aux = MODULE.apply({'params': params}, x, memory, ctx)
      return jnp.sum(y * readout), aux['expire_span_loss']
    return (jax.grad(lambda p: objective(p)[0])(params), jax.grad(lambda p: objective(p)[1])(params))

  from_output, from_loss = grads(layer_params)
  for g in (from_output, from_loss):
    assert np.abs(np.asarray(g['expire_span']['kernel'])).max() > 0
    assert abs(float(g['expire_span_bias'])) > 0
  assert float(from_loss['expire_span_bias']) > 0      # the penalty shrinks spans


def test_very_large_spans_equal_xl():
  num_chunks, mem_len = 6, 6
  positions = np.tile(np.arange(num_chunks * C, dtype=np.int32), (B, 1))
  segments = np.stack([positions[0] // 6, positions[1] // 8]).astype(np.int32)
  starts = np.stack([positions[0] % 6 == 0, positions[1] % 8 == 0])
  ctxs = [AttentionContext(positions=jnp.asarray(positions[:, s]), segment_ids=jnp.asarray(segments[:, s]),
                           reset=jnp.asarray(starts[:, s.start]), valid=jnp.ones((B, C), bool))
          for s in (slice(i * C, (i + 1) * C) for i in range(num_chunks))]
  xs = jax.random.normal(jax.random.PRNGKey(5), (num_chunks, B, C, D))
  module = ExpireSpanAttention(config=ExpireSpanConfig(max_span=1000, ramp=R), shared=SHARED)
  xl = XLAttention(config=XLConfig(relative_impl='shift'), shared=SHARED)
  state, xl_state = fifo.create(B, mem_len, (D,)), fifo.create(B, mem_len, (D,))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), xs[0], state, ctxs[0])['params']
  params = dict(params, content_bias=jax.random.normal(jax.random.PRNGKey(3), (H, HD)),
                position_bias=jax.random.normal(jax.random.PRNGKey(4), (H, HD)),
                expire_span=dict(kernel=jnp.zeros((D, 1))), expire_span_bias=jnp.asarray(40.0))
  xl_params = {k: v for k, v in params.items() if not k.startswith('expire_span')}
  apply, xl_apply = jax.jit(module.apply), jax.jit(xl.apply)
  for x, ctx in zip(xs, ctxs):
    y, state, _ = apply({'params': params}, x, state, ctx)
    y_xl, xl_state, _ = xl_apply({'params': xl_params}, x, xl_state, ctx)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_xl), rtol=1e-5, atol=1e-5)
  assert np.asarray(state.valid).sum() > 0


@pytest.mark.parametrize('settings,key', [
    ({'max_span': -1}, 'max_span'), ({'ramp': 0}, 'ramp'),
    ({'init_fraction': 1.0}, 'init_fraction'), ({'init_fraction': 0.0}, 'init_fraction'),
    ({'clamp_len': 0}, 'clamp_len'), ({'pre_div': 0.0}, 'pre_div'), ({'loss': 'sum'}, 'loss')])
def test_bad_settings_name_their_config_key(settings, key):
  with pytest.raises(ConfigError, match=rf'model\.expire_span\.{key}: '):
    tiny_config(attention='expire_span', expire_span=settings)


def test_max_span_zero_needs_a_memory_length():
  with pytest.raises(ConfigError, match=r'model\.expire_span\.max_span: 0 must be > 0 when '
                                        r'model\.mem_len is 0'):
    tiny_config(attention='expire_span', mem_len=0)
  config = tiny_model_config(attention='expire_span', mem_len=0, expire_span={'max_span': 8})
  assert attention_layer(config, jnp.float32).largest_span == 8


def test_attention_layer_reads_the_section():
  config = tiny_model_config(attention='expire_span', mem_len=12, expire_span={
      'ramp': 4, 'init_fraction': 0.25, 'shorten': True, 'clamp_len': 9, 'pre_div': 64.0,
      'loss': 'ramp'})
  module = attention_layer(config, jnp.float32)
  assert isinstance(module, ExpireSpanAttention)
  assert (module.largest_span, module.config.ramp, module.config.init_fraction,
          module.config.shorten, module.relative_settings(), module.config.pre_div,
          module.config.loss) == (12, 4, 0.25, True, (9, 'gather'), 64.0, 'ramp')


def test_old_flat_names_migrate_to_the_section():
  values, moved = migrate_flat_model({
      'attention': 'expire_span', 'expire_span_max': 64, 'expire_span_ramp': 8,
      'expire_span_init_fraction': 0.2, 'expire_span_shorten': True, 'clamp_len': 5})
  assert values == {'attention': 'expire_span', 'expire_span': {
      'max_span': 64, 'ramp': 8, 'init_fraction': 0.2, 'shorten': True, 'clamp_len': 5}}
  assert ('expire_span_max', 'expire_span.max_span') in moved


@pytest.mark.slow  # a train.py smoke run; the layer tests cover the variant
def test_tiny_training_reports_expire_span_loss(tmp_path):
  config = tiny_config(attention='expire_span',
                       expire_span={'max_span': 32, 'ramp': 4, 'shorten': True})
  config.model.aux_loss_weights.expire_span_loss = 1e-3
  config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 2
  assert np.isfinite(metrics['loss'])
  assert 0 < metrics['aux/expire_span_loss'] < 32 * config.model.num_layers   # summed over layers
  assert 0 < metrics['aux/memory_occupancy'] <= 1

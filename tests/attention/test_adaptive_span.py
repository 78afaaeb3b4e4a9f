"""Adaptive-Span attention against Transformer-XL and a Python soft-mask reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import unfreeze

from longformer_jax.attention.adaptive_span import (AdaptiveSpanAttention, AdaptiveSpanConfig,
                                                    memory_sizes, span_mask, trimmed_size_index)
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer
from longformer_jax.attention.xl import XLAttention
from longformer_jax.config.errors import ConfigError
from longformer_jax.memory import fifo
from longformer_jax.config.migration import migrate_flat_model
from tests.support.position_references import numpy_sinusoid
from tests.support.tiny_models import random_normal, shared_settings, tiny_config, tiny_model_config

B, C, M, D, H, HD = 2, 8, 16, 16, 2, 8


def _inputs(memory_positions_from=0):
  x = random_normal(1, (B, C, D))
  memory = fifo.FifoMemory(values=random_normal(2, (B, M, D)),
                           positions=jnp.tile(jnp.arange(M, dtype=jnp.int32), (B, 1)),
                           segment_ids=jnp.zeros((B, M), jnp.int32), valid=jnp.ones((B, M), bool))
  positions = jnp.tile(jnp.arange(M, M + C, dtype=jnp.int32), (B, 1))
  ctx = AttentionContext(positions=positions, segment_ids=jnp.zeros((B, C), jnp.int32),
                         reset=jnp.zeros((B,), bool), valid=jnp.ones((B, C), bool))
  return x, memory, ctx


def _module(cls=AdaptiveSpanAttention, **section):
  """The layer with `section`'s `AdaptiveSpanConfig` settings (ramp 4, block 4 unless given)."""
  section = dict(dict(ramp=4.0, block=4), **section)
  return cls(config=AdaptiveSpanConfig(**section),
             shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, mem_len=M))


def _set_spans(params, fractions):
  params = unfreeze(params)
  box = params['span_fraction']
  params['span_fraction'] = box.replace_boxed(jnp.asarray(fractions, jnp.float32))
  return params


def test_soft_mask_matches_python():
  spans = np.array([0.0, 3.5, 10.0])
  for z in spans:
    for x in range(0, 20):
      expected = min(1.0, max(0.0, (4.0 + z - x) / 4.0))
      np.testing.assert_allclose(float(span_mask(jnp.float32(z), jnp.int32(x), 4.0)), expected,
                                 rtol=1e-6)


def test_whole_context_span_and_vanishing_ramp_equals_xl():
  x, memory, ctx = _inputs()
  module = _module(max_span=M + C, init=1.0, ramp=1e-3)
  params = module.init(jax.random.PRNGKey(0), x, memory, ctx)['params']
  got, state, aux = module.apply({'params': params}, x, memory, ctx)
  xl_params = {k: v for k, v in params.items() if k != 'span_fraction'}
  xl = XLAttention(shared=shared_settings(num_heads=H, head_dim=HD, d_model=D))
  want, xl_state, _ = xl.apply({'params': xl_params}, x, memory, ctx)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(state.values), np.asarray(xl_state.values))
  np.testing.assert_allclose(float(aux['span_loss']), M + C, rtol=1e-6)


def reference_adaptive_span(params, x, memory, ctx, spans, ramp):
  """Dense float64 loop: XL scores (explicit R[i - j]), weights * m_z(i - j) per head, renormalised."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  cat = np.concatenate([np.asarray(memory.values), np.asarray(x)], axis=1)
  k_pos = np.concatenate([np.asarray(memory.positions), np.asarray(ctx.positions)], axis=1)
  q_pos = np.asarray(ctx.positions)
  q = np.einsum('bqd,dhe->bqhe', np.asarray(x, np.float64), p['query']['kernel'])
  k = np.einsum('bkd,dhe->bkhe', cat, p['key']['kernel'])
  v = np.einsum('bkd,dhe->bkhe', cat, p['value']['kernel'])
  u, vb = p['content_bias'], p['position_bias']
  out = np.zeros(q.shape)
  for b in range(B):
    for i in range(C):
      for h in range(H):
        weights = np.zeros(cat.shape[1])
        for j in range(cat.shape[1]):
          distance = q_pos[b, i] - k_pos[b, j]
          if distance < 0:
            continue
          r = numpy_sinusoid(distance, D) @ p['relative_key']['kernel'][:, h]
          score = ((q[b, i, h] + u[h]) @ k[b, j, h] + (q[b, i, h] + vb[h]) @ r) / np.sqrt(HD)
          soft = min(1.0, max(0.0, (ramp + spans[h] - distance) / ramp))
          weights[j] = np.exp(score) * soft
        out[b, i, h] = (weights / weights.sum()) @ v[b, :, h]
  return np.einsum('bqhe,hed->bqd', out, p['out']['kernel'])


@pytest.mark.parametrize('fractions', [(0.1, 0.4), (0.0, 1.0), (0.3, 0.3)])
def test_soft_span_and_trimming_match_the_dense_reference(fractions):
  x, memory, ctx = _inputs()
  module = _module()
  params = _set_spans(module.init(jax.random.PRNGKey(0), x, memory, ctx)['params'], fractions)
  got, _, aux = module.apply({'params': params}, x, memory, ctx)
  untrimmed, _, _ = _module(trim=False).apply({'params': params}, x, memory, ctx)
  expected = reference_adaptive_span(params, x, memory, ctx, np.array(fractions) * M, 4.0)
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)
  np.testing.assert_allclose(np.asarray(untrimmed), expected, atol=1e-5)
  np.testing.assert_allclose(float(aux['span_loss']), np.mean(fractions) * M, rtol=1e-6)


def test_trimmed_size_covers_every_entry_with_nonzero_mask():
  sizes = memory_sizes(16, 4)
  assert sizes == [0, 4, 8, 12, 16]
  for z in np.linspace(0, 20, 81):
    size = sizes[int(trimmed_size_index(jnp.float32(z), 4.0, 16, 4))]
    farthest_needed = [k for k in range(1, 17) if (4.0 + z - k) / 4.0 > 0]
    assert size >= (max(farthest_needed) if farthest_needed else 0)
    assert size - 4 < (max(farthest_needed) if farthest_needed else 0) or size == 0


def test_span_gradient_reaches_the_span_parameter():
  x, memory, ctx = _inputs()
  module = _module()
  params = _set_spans(module.init(jax.random.PRNGKey(0), x, memory, ctx)['params'], (0.3, 0.5))

  def loss(p):
    y, _, aux = module.apply({'params': p}, x, memory, ctx)
    return jnp.sum(y ** 2) + aux['span_loss']
  grads = jax.grad(loss)(params)
  assert np.all(np.abs(np.asarray(grads['span_fraction'].unbox())) > 0)


class _UnclippedSpans(AdaptiveSpanAttention):
  """The reference for the span gradient: z = S * span_fraction, no clip at all."""

  def spans(self, x):
    init = nn.with_logical_partitioning(nn.initializers.constant(self.config.init), ('heads',))
    return self.largest_span * self.param('span_fraction', init, (self.shared.num_heads,),
                                          jnp.float32)


@pytest.fixture(scope='module')
def inputs_and_params():
  x, memory, ctx = _inputs()
  return x, memory, ctx, jax.jit(_module(trim=False).init)(jax.random.PRNGKey(0), x, memory,
                                                           ctx)['params']


def test_span_gradient_is_the_clamp_after_update_gradient(inputs_and_params):
  """At 0, at 1 and outside [0, 1]: the gradient the paper's clamp-after-update rule
  sees, i.e. the loss of the unclipped function differentiated at the clamped value."""
  x, memory, ctx, params = inputs_and_params
  cotangent = random_normal(3, (B, C, D))

  def gradient(cls):
    def loss(f):
      y, _, aux = _module(cls, trim=False).apply({'params': _set_spans(params, f)}, x, memory, ctx)
      return jnp.sum(cotangent * y) + aux['span_loss']
    return jax.jit(jax.grad(loss))

  got, reference = gradient(AdaptiveSpanAttention), gradient(_UnclippedSpans)
  for fractions in [(0.0, 1.0), (-0.05, 1.05)]:
    want = np.asarray(reference(jnp.clip(jnp.asarray(fractions, jnp.float32), 0.0, 1.0)))
    assert np.all(np.abs(want) > 1e-3)
    np.testing.assert_allclose(np.asarray(got(jnp.asarray(fractions, jnp.float32))), want,
                               rtol=1e-5, atol=1e-6)


def test_span_pushed_below_zero_grows_again_when_the_loss_wants_it(inputs_and_params):
  """From init 0 the penalty alone pushes the parameter below 0 (span stays 0);
  then SGD on a loss whose target used a longer span moves the span up from 0."""
  x, memory, ctx, params = inputs_and_params
  module = _module(block=8)                        # trimmed, as in training

  @jax.jit
  def step(fractions, target, data_weight, penalty_weight):
    """One SGD step; also the output and the largest effective span before it."""
    def loss(f):
      y, _, aux = module.apply({'params': _set_spans(params, f)}, x, memory, ctx)
      value = data_weight * jnp.sum((y - target) ** 2) + penalty_weight * aux['span_loss']
      return value, (y, aux['span_largest'])
    (_, (y, largest)), grad = jax.value_and_grad(loss, has_aux=True)(fractions)
    return fractions - 0.01 * grad, y, largest

  _, target, _ = step(jnp.full((H,), 0.5), jnp.zeros_like(x), 0.0, 0.0)
  fractions = jnp.zeros((H,), jnp.float32)              # init 0, the paper's default
  for _ in range(3):                                    # the penalty alone
    fractions, _, _ = step(fractions, target, 0.0, 0.1)
  assert np.all(np.asarray(fractions) < 0)
  assert float(step(fractions, target, 0.0, 0.0)[2]) == 0.0
  for _ in range(5):                                    # a loss that wants a longer span
    fractions, _, _ = step(fractions, target, 0.01, 1e-3)
  assert np.all(np.asarray(fractions) > 0)
  assert float(step(fractions, target, 0.0, 0.0)[2]) > 0.5   # ~1.7 of S = 16


def test_dynamic_span_shapes_and_penalty():
  x, memory, ctx = _inputs()
  module = _module(dynamic=True)
  params = module.init(jax.random.PRNGKey(0), x, memory, ctx)['params']
  got, _, aux = module.apply({'params': params}, x, memory, ctx)
  untrimmed, _, _ = _module(dynamic=True, trim=False).apply({'params': params}, x, memory, ctx)
  np.testing.assert_allclose(np.asarray(got), np.asarray(untrimmed), atol=1e-5)
  assert 0.0 < float(aux['span_loss']) < M


@pytest.mark.slow
def test_adaptive_span_model_trains_and_eval_reports_spans(tmp_path):
  import json
  from eval import evaluate_run
  from train import train
  config = tiny_config(attention='adaptive_span',
                       adaptive_span={'ramp': 4.0, 'block': 4, 'init': 0.5})
  config.model.aux_loss_weights.span_loss = 1e-3
  config.train.update(num_steps=2, checkpoint_every=2)
  _, metrics = train(config, str(tmp_path))
  assert np.isfinite(metrics['loss']) and 'aux/span_loss' in metrics
  config.eval.max_tokens = 256
  result = evaluate_run(config, str(tmp_path))
  spans = json.loads((tmp_path / 'eval' / 'spans.json').read_text())
  assert spans == result['learned_spans'] and [r['layer'] for r in spans] == [0, 1]
  assert all(0.0 <= z <= 16.0 for r in spans for z in r['spans'])
  assert (tmp_path / 'eval' / 'spans.png').exists()


def test_span_report_reads_each_heads_span(tmp_path):
  import dataclasses
  from longformer_jax.models.decoder_lm import DecoderLM
  from longformer_jax.evaluation.span_report import learned_spans, markdown_spans, plot_spans
  from tests.support.tiny_models import context_of, stream_batch
  config = tiny_model_config(attention='adaptive_span', adaptive_span={'block': 4})
  config = dataclasses.replace(config, layer_schedule={'attention': 'xl,adaptive_span'})
  batch = stream_batch(2, 8)
  params = DecoderLM(config).init(jax.random.PRNGKey(0), batch['inputs'], DecoderLM.init_state(config, 2),
                                  context_of(batch))['params']
  params['blocks']['layer_1']['attention'] = _set_spans(params['blocks']['layer_1']['attention'],
                                                        (0.25, 1.5))
  rows = learned_spans(params, config)
  assert rows == [{'layer': 1, 'spans': [0.25 * 16, 16.0]}]
  assert '| 1 | 4.0 | 16.0 | 10.0 |' in markdown_spans(rows)
  plot_spans(rows, str(tmp_path / 'spans.png'), 'spans')
  assert (tmp_path / 'spans.png').stat().st_size > 0


# ---- config section ---------------------------------------------------------

@pytest.mark.parametrize('settings,key', [
    ({'max_span': -1}, 'max_span'), ({'ramp': 0.0}, 'ramp'), ({'init': 1.5}, 'init'),
    ({'init': -0.1}, 'init'), ({'block': 0}, 'block'), ({'clamp_len': 0}, 'clamp_len'),
    ({'dynamic': True, 'init': 0.5}, 'init')])     # init is read by learned spans only
def test_bad_settings_name_their_config_key(settings, key):
  with pytest.raises(ConfigError, match=rf'model\.adaptive_span\.{key}: '):
    tiny_config(attention='adaptive_span', adaptive_span=settings)


def test_max_span_zero_needs_a_memory_length():
  with pytest.raises(ConfigError, match=r'model\.adaptive_span\.max_span: 0 must be > 0 when '
                                        r'model\.mem_len is 0'):
    tiny_config(attention='adaptive_span', mem_len=0)


def test_attention_layer_reads_the_section():
  config = tiny_model_config(attention='adaptive_span', mem_len=12, adaptive_span={
      'max_span': 20, 'ramp': 2.0, 'init': 0.25, 'block': 3, 'trim': False, 'clamp_len': 9})
  module = attention_layer(config, jnp.float32)
  assert isinstance(module, AdaptiveSpanAttention)
  section = module.config
  assert (module.shared.mem_len, section.max_span, section.ramp, section.init, section.block,
          section.dynamic, section.trim, section.clamp_len) == (
              12, 20, 2.0, 0.25, 3, False, False, 9)
  assert module.largest_span == 20
  default = attention_layer(tiny_model_config(attention='adaptive_span', mem_len=12), jnp.float32)
  assert default.largest_span == 12                    # max_span 0 takes mem_len


def test_old_flat_names_migrate_to_the_section():
  values, moved = migrate_flat_model({
      'attention': 'adaptive_span', 'span_max': 64, 'span_ramp': 8.0, 'span_init': 0.5,
      'span_block': 16, 'span_dynamic': False, 'span_trim': False, 'clamp_len': 5})
  assert values == {'attention': 'adaptive_span', 'adaptive_span': {
      'max_span': 64, 'ramp': 8.0, 'init': 0.5, 'block': 16, 'dynamic': False, 'trim': False,
      'clamp_len': 5}}
  assert ('span_dynamic', 'adaptive_span.dynamic') in moved


def _torch_clamp_mask(spans, distances, ramp):
  """The paper's code: torch.clamp, whose gradient is 1 on the closed interval [0, 1]."""
  ramped = (ramp + spans - distances.astype(jnp.float32)) / ramp
  keep = (ramped >= 0.0) & (ramped <= 1.0)
  return jnp.where(keep, ramped, jax.lax.stop_gradient(jnp.minimum(jnp.maximum(ramped, 0.0),
                                                                   1.0)))


def test_mask_corners_carry_the_whole_gradient():
  """R = 20, z = 0: d m / d z = 1/R at every distance 0..R, the corners included
  (jnp.clip gave 1/(2R) at d = 0 and d = 20), and 0 beyond."""
  ramp = 20.0
  distances = jnp.arange(0, 26, dtype=jnp.int32)
  grads = jax.vmap(jax.grad(lambda z, d: span_mask(z, d, ramp)), in_axes=(None, 0))(
      jnp.float32(0.0), distances)
  want = np.where(np.arange(26) <= 20, 1.0 / ramp, 0.0)
  np.testing.assert_allclose(np.asarray(grads), want, rtol=1e-6, atol=0)


def test_layer_span_gradient_at_whole_spans_equals_the_clamp_reference(monkeypatch):
  """The issue's layer (B 2, d_model 64, 4 heads of 16, memory 127, R 20) at z = 0:
  the span gradient equals the one with the paper's torch.clamp mask."""
  batch, chunk, d_model, heads, head_dim, mem = 2, 8, 64, 4, 16, 127
  x = random_normal(11, (batch, chunk, d_model))
  memory = fifo.FifoMemory(values=random_normal(12, (batch, mem, d_model)),
                           positions=jnp.tile(jnp.arange(mem, dtype=jnp.int32), (batch, 1)),
                           segment_ids=jnp.zeros((batch, mem), jnp.int32),
                           valid=jnp.ones((batch, mem), bool))
  ctx = AttentionContext(
      positions=jnp.tile(jnp.arange(mem, mem + chunk, dtype=jnp.int32), (batch, 1)),
      segment_ids=jnp.zeros((batch, chunk), jnp.int32), reset=jnp.zeros((batch,), bool),
      valid=jnp.ones((batch, chunk), bool))
  module = AdaptiveSpanAttention(
      config=AdaptiveSpanConfig(ramp=20.0, init=0.0, trim=False),
      shared=shared_settings(num_heads=heads, head_dim=head_dim, d_model=d_model, mem_len=mem))
  params = module.init(jax.random.PRNGKey(0), x, memory, ctx)['params']
  cotangent = random_normal(13, (batch, chunk, d_model))

  def span_gradient():
    def loss(f):
      y, _, _ = module.apply({'params': _set_spans(params, f)}, x, memory, ctx)
      return jnp.sum(cotangent * y)
    return np.asarray(jax.grad(loss)(jnp.zeros((heads,), jnp.float32)))

  got = span_gradient()
  monkeypatch.setattr('longformer_jax.attention.adaptive_span.span_mask', _torch_clamp_mask)
  want = span_gradient()
  assert np.all(np.abs(want) > 1e-2)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

"""Longformer attention against an independent dense-mask reference.

The reference builds the whole `[queries, keys]` mask from positions (window
rule with per-head dilation, causality, documents, padding, global tokens),
takes a plain softmax over the full rows and applies the local or global
projections: float64 numpy for values, the same code on jax.numpy for
gradients. The fast path (blocked slabs, residue interleaving for dilation,
merged global part) must agree on random inputs, with and without a cache.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.longformer.dilated_window import dilated_window_attention
from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.sliding_window import blocked_window_attention
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.model_config import resolve_model
from longformer_jax.memory import fifo
from longformer_jax.models.resolved_model import resolved_model
from tests.support.tiny_models import shared_settings

B, D, H, HD = 2, 16, 2, 8


def rope(xp, x, positions):
  """Rotary positions, pairs (i, i + half): `x [b, l, h, e]`, `positions [b, l]`."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (10000.0 ** (np.arange(half) / half))
  angles = positions[:, :, None, None] * inv_freq
  x1, x2 = x[..., :half], x[..., half:]
  return xp.concatenate([x1 * xp.cos(angles) - x2 * xp.sin(angles),
                         x2 * xp.cos(angles) + x1 * xp.sin(angles)], axis=-1)


def first_globals(flags, valid, limit):
  """`[b, c]` bool: the first `limit` flagged valid tokens of each row."""
  flags = flags & valid
  return flags & (np.cumsum(flags, axis=1) <= limit)


def dense_masks(settings, q_pos, q_seg, k_pos, k_seg, k_valid, is_global):
  """Local rows' mask `[b, h, c, k]` and global rows' mask `[b, c, k]` (numpy bool)."""
  causal, window = settings['causal'], settings['window']
  distance = q_pos[:, :, None] - k_pos[:, None, :]
  base = k_valid[:, None, :] & (q_seg[:, :, None] == k_seg[:, None, :])
  if causal:
    base &= distance >= 0
  offset = k_pos.shape[1] - q_pos.shape[1]
  key_is_global = np.pad(is_global, ((0, 0), (offset, 0)))
  local = []
  for d in settings['head_dilations']:
    in_window = (np.abs(distance) <= window * d) & (distance % d == 0)
    local.append(base & (in_window | key_is_global[:, None, :]))
  return np.stack(local, axis=1), base


def softmax_rows(xp, logits, mask):
  logits = xp.where(mask, logits, -np.inf)
  top = xp.max(logits, axis=-1, keepdims=True)
  top = xp.where(xp.isfinite(top), top, 0.0)
  e = xp.exp(logits - top)
  total = e.sum(axis=-1, keepdims=True)
  return e / xp.where(total > 0, total, 1.0)


def reference(xp, params, x, context_values, masks, q_pos, k_pos, is_global, settings):
  """Dense Longformer attention: `[b, c, d_model]`."""
  local_mask, global_mask = masks
  origin = q_pos[:, :1]
  proj = lambda inp, name: xp.einsum('bld,dhe->blhe', inp, params[name]['kernel'])
  scale = 1.0 / np.sqrt(HD)
  q = rope(xp, proj(x, 'query'), q_pos - origin)
  k = rope(xp, proj(context_values, 'key'), k_pos - origin)
  v = proj(context_values, 'value')
  weights = softmax_rows(xp, xp.einsum('bqhe,bkhe->bhqk', q, k) * scale, local_mask)
  out = xp.einsum('bhqk,bkhe->bqhe', weights, v)
  if settings['global_tokens']:
    suffix = '_global' if settings['global_projections'] else ''
    qg = rope(xp, proj(x, 'query' + suffix), q_pos - origin)
    kg = rope(xp, proj(context_values, 'key' + suffix), k_pos - origin)
    vg = proj(context_values, 'value' + suffix)
    weights = softmax_rows(xp, xp.einsum('bqhe,bkhe->bhqk', qg, kg) * scale, global_mask[:, None])
    out = xp.where(is_global[:, :, None, None], xp.einsum('bhqk,bkhe->bqhe', weights, vg), out)
  return xp.einsum('bqhe,hed->bqd', out, params['out']['kernel'])


def longformer(head_dilations=(1,), causal=True, dtype=jnp.float32, **section):
  """The module (H heads), one dilation per head in `head_dilations`, `section` its other
  `LongformerConfig` values."""
  config = LongformerConfig(head_dilations=','.join(map(str, head_dilations)), **section)
  return LongformerAttention(config=config, dtype=dtype,
                             shared=shared_settings(num_heads=H, head_dim=HD, d_model=D,
                                                    causal=causal))


def make_case(causal=True, chunk=13, window=3, head_dilations=(1, 2), block_size=4,
              global_tokens=0, global_projections=True, padding=False, cache=False, seed=0,
              dtype=jnp.float32, perturb_global=True):
  """A module, its parameters and one random chunk (with a filled cache when `cache`)."""
  settings = dict(window=window, head_dilations=head_dilations, causal=causal,
                  block_size=block_size, global_tokens=global_tokens,
                  global_projections=global_projections, window_cache=cache)
  module = longformer(dtype=dtype, **settings)
  rng = np.random.default_rng(seed)
  start = 40
  q_pos = np.tile(np.arange(start, start + chunk, dtype=np.int32), (B, 1))
  q_seg = np.zeros((B, chunk), np.int32)
  q_seg[1, chunk // 2:] = 1                       # a document starts inside row 1's chunk
  valid = np.ones((B, chunk), bool)
  if padding:
    valid[0, -3:] = False
    valid[1, 2] = False
  flags = rng.random((B, chunk)) < 0.25
  flags[0, 1] = True
  capacity = window * max(head_dilations) if cache else 0
  mem = fifo.create(B, capacity, (D,))
  if cache:
    mem = mem.replace(values=jnp.asarray(rng.normal(size=(B, capacity, D)), jnp.float32),
                      positions=jnp.tile(jnp.arange(start - capacity, start, dtype=jnp.int32),
                                         (B, 1)),
                      valid=jnp.asarray(rng.random((B, capacity)) < 0.8))
  ctx = AttentionContext(positions=jnp.asarray(q_pos), segment_ids=jnp.asarray(q_seg),
                         reset=jnp.zeros((B,), bool), valid=jnp.asarray(valid),
                         global_flags=jnp.asarray(flags))
  x = jnp.asarray(rng.normal(size=(B, chunk, D)), jnp.float32)
  params = jax.jit(module.init)(jax.random.PRNGKey(seed), x, mem, ctx)['params']
  # Global projections that differ from the local ones, so that using the
  # wrong set is caught.
  params = jax.tree_util.tree_map(lambda a: a, nn.meta.unbox(params))
  for name in ('query_global', 'key_global', 'value_global'):
    if name in params and perturb_global:
      params[name] = {'kernel': params[name]['kernel'] * 1.5 + 0.1}
  return module, params, x, mem, ctx, settings


def reference_inputs(x, mem, ctx, settings):
  context_values = np.concatenate([np.asarray(mem.values), np.asarray(x)], axis=1)
  k_pos = np.concatenate([np.asarray(mem.positions), np.asarray(ctx.positions)], axis=1)
  k_seg = np.concatenate([np.asarray(mem.segment_ids), np.asarray(ctx.segment_ids)], axis=1)
  k_valid = np.concatenate([np.asarray(mem.valid), np.asarray(ctx.valid)], axis=1)
  q_pos, q_seg = np.asarray(ctx.positions), np.asarray(ctx.segment_ids)
  is_global = (first_globals(np.asarray(ctx.global_flags), np.asarray(ctx.valid),
                             settings['global_tokens'])
               if settings['global_tokens'] else np.zeros(q_pos.shape, bool))
  masks = dense_masks(settings, q_pos, q_seg, k_pos, k_seg, k_valid, is_global)
  return context_values, masks, q_pos, k_pos, is_global


CASES = {
    'causal_multiple_of_block': dict(chunk=16, window=4, head_dilations=(1, 1)),
    'causal_ragged_dilated_global_padded': dict(chunk=13, head_dilations=(1, 2), global_tokens=2,
                                                padding=True),
    'two_sided_ragged_dilated_global_padded': dict(causal=False, chunk=13, head_dilations=(1, 3),
                                                   global_tokens=2, padding=True),
    'two_sided_auto_block': dict(causal=False, chunk=20, window=5, head_dilations=(2, 2),
                                 block_size=0),
    'causal_cache_dilated_global': dict(chunk=11, head_dilations=(1, 2), global_tokens=1,
                                        cache=True, padding=True),
    'shared_global_projections': dict(chunk=12, head_dilations=(1, 1), global_tokens=3,
                                      global_projections=False, block_size=3),
    'window_wider_than_chunk': dict(chunk=7, window=9, head_dilations=(1, 2), block_size=2),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_matches_dense_reference(name):
  module, params, x, mem, ctx, settings = make_case(**CASES[name])
  y, _, aux = jax.jit(module.apply)({'params': params}, x, mem, ctx)
  p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  context_values, masks, q_pos, k_pos, is_global = reference_inputs(x, mem, ctx, settings)
  expected = reference(np, p64, np.asarray(x, np.float64), np.asarray(context_values, np.float64),
                       masks, q_pos, k_pos, is_global, settings)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)
  if settings['global_tokens']:
    flagged = np.sum(np.asarray(ctx.global_flags) & np.asarray(ctx.valid), axis=1)
    dropped = np.mean(np.maximum(flagged - settings['global_tokens'], 0))
    np.testing.assert_allclose(float(aux['global_tokens_dropped']), dropped)


@pytest.mark.parametrize('name', [
    pytest.param('causal_ragged_dilated_global_padded', marks=pytest.mark.slow),
    'two_sided_ragged_dilated_global_padded', 'causal_cache_dilated_global'])
def test_gradients_match_reference(name):
  module, params, x, mem, ctx, settings = make_case(**CASES[name])
  context_values, masks, q_pos, k_pos, is_global = reference_inputs(x, mem, ctx, settings)
  cotangent = jnp.asarray(np.random.default_rng(5).normal(size=x.shape), jnp.float32)
  mem_len = mem.positions.shape[1]

  def fast_loss(params, x):
    y, _, _ = module.apply({'params': params}, x, mem, ctx)
    return jnp.sum(y * cotangent)

  def reference_loss(params, x):
    values = jnp.concatenate([mem.values, x], axis=1)[:, :mem_len + x.shape[1]]
    y = reference(jnp, params, x, values, masks, q_pos, k_pos, is_global, settings)
    return jnp.sum(y * cotangent)

  fast = jax.jit(jax.grad(fast_loss, argnums=(0, 1)))(params, x)
  expected = jax.jit(jax.grad(reference_loss, argnums=(0, 1)))(params, x)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5),
      fast, expected)


def attended_slots(window, dilation, causal, length=24, query=12):
  """Which key slots query `query` attends to: uniform logits, one-hot values."""
  q = jnp.zeros((1, length, 1, length))
  v = jnp.eye(length)[None, :, None, :]
  pos = jnp.arange(length, dtype=jnp.int32)[None]
  zeros = jnp.zeros_like(pos)
  out, _ = jax.jit(dilated_window_attention, static_argnames=(
      'window', 'dilation', 'block_size', 'causal'))(q, q, v, pos, zeros, pos, zeros, jnp.ones((1, length), bool),
                                    window=window, dilation=dilation, block_size=4, causal=causal)
  return [int(j) for j in np.flatnonzero(np.asarray(out[0, query, 0]) > 1e-6)]


def test_window_is_one_sided():
  # window w = 2 here is Hugging Face's attention_window = 4.
  assert attended_slots(2, 1, causal=True) == [10, 11, 12]
  assert attended_slots(2, 1, causal=False) == [10, 11, 12, 13, 14]
  assert attended_slots(2, 3, causal=True) == [6, 9, 12]
  assert attended_slots(2, 3, causal=False) == [6, 9, 12, 15, 18]


def test_bfloat16_keeps_float32_softmax_and_zero_masked_rows():
  module32, params, x, mem, ctx, settings = make_case(causal=False, chunk=13, global_tokens=2)
  # Row 1: every token is padding, so every query row is fully masked.
  ctx = ctx.replace(valid=ctx.valid.at[1].set(False))
  module16 = module32.clone(dtype=jnp.bfloat16)
  y32, _, _ = jax.jit(module32.apply)({'params': params}, x, mem, ctx)
  y16, _, _ = jax.jit(module16.apply)({'params': params}, x, mem, ctx)
  assert y16.dtype == jnp.bfloat16
  assert np.isfinite(np.asarray(y16, np.float32)).all()
  np.testing.assert_array_equal(np.asarray(y16[1], np.float32), 0.0)
  error = np.abs(np.asarray(y16[0], np.float32) - np.asarray(y32[0]))
  assert error.max() < 0.03 * np.abs(np.asarray(y32[0])).max()
  # The kernel's log-sum-exp (its softmax statistics) is float32 for bfloat16 inputs.
  q = jnp.ones((1, 8, 1, 4), jnp.bfloat16)
  pos = jnp.arange(8, dtype=jnp.int32)[None]
  out, lse = jax.jit(lambda q: blocked_window_attention(
      q, q, q, pos, pos * 0, pos, pos * 0, pos < 0, window=2, block_size=4))(q)
  assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
  assert np.all(np.asarray(out, np.float32) == 0) and np.all(np.isneginf(np.asarray(lse)))


def test_stream_with_cache_equals_one_long_sequence():
  """Chunk by chunk with the window cache is exactly the whole sequence at once."""
  window, dilations, chunk, chunks = 5, (1, 2), 8, 4
  module = longformer(window=window, head_dilations=dilations, block_size=4, window_cache=True)
  length = chunk * chunks
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(B, length, D)), jnp.float32)
  pos = jnp.tile(jnp.arange(length, dtype=jnp.int32), (B, 1))
  seg = jnp.asarray(np.stack([np.zeros(length), np.arange(length) >= 19]).astype(np.int32))
  valid = jnp.ones((B, length), bool)
  context = lambda sl, reset: AttentionContext(positions=pos[:, sl], segment_ids=seg[:, sl],
                                               reset=reset, valid=valid[:, sl])
  state = fifo.create(B, window * max(dilations), (D,))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x[:, :chunk], state,
                                context(slice(0, chunk), jnp.ones((B,), bool)))
  whole, _, _ = jax.jit(module.apply)(params, x, state, context(slice(None), jnp.ones((B,), bool)))
  step = jax.jit(lambda s, xc, c: module.apply(params, xc, s, c)[:2])
  pieces = []
  for i in range(chunks):
    sl = slice(i * chunk, (i + 1) * chunk)
    y, state = step(state, x[:, sl], context(sl, jnp.full((B,), i == 0)))
    pieces.append(y)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), np.asarray(whole),
                             rtol=2e-5, atol=2e-6)


def test_global_projections_start_equal_to_local_ones():
  _, params, _, _, _, _ = make_case(global_tokens=2, perturb_global=False)
  for name in ('query', 'key', 'value'):
    np.testing.assert_array_equal(params[name + '_global']['kernel'], params[name]['kernel'])
  assert not np.allclose(params['query']['kernel'], params['key']['kernel'])


def test_blocked_path_is_linear_in_length():
  """No n x n array: XLA's temporary memory of forward+backward grows linearly."""
  def temp_bytes(n):
    q = jnp.zeros((1, n, 2, 16))
    pos = jnp.arange(n, dtype=jnp.int32)[None]
    loss = lambda q, k, v: jnp.sum(blocked_window_attention(
        q, k, v, pos, pos * 0, pos, pos * 0, pos >= 0, window=32, block_size=32)[0])
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, q, q).compile()
    return compiled.memory_analysis().temp_size_in_bytes
  small, large = temp_bytes(1024), temp_bytes(4096)
  assert large < 4 * 1.25 * small
  assert large < 4096 * 4096 * 4 / 8      # far below one head's dense score matrix


def model_config(**longformer):
  """A resolved model config (4 heads) with `model.longformer` set to `longformer`."""
  causal = longformer.pop('causal', True)
  return resolved_model(resolve_model(
      dict(attention='longformer', num_heads=4, head_dim=HD, d_model=D, causal=causal,
           longformer=longformer)))


@pytest.mark.parametrize('keys,bad_key', [
    (dict(window=0), 'model.longformer.window'),
    (dict(head_dilations='1,2,2'), 'model.longformer.head_dilations'),   # 3 values, 4 heads
    (dict(head_dilations='1,x,1,1'), 'model.longformer.head_dilations'),
    (dict(head_dilations='1,0,1,1'), 'model.longformer.head_dilations'),
    (dict(dilation=0), 'model.longformer.dilation'),
    (dict(dilation=2, head_dilations='1,1,2,2'), 'model.longformer.dilation'),  # one of them
    (dict(block_size=-1), 'model.longformer.block_size'),
    (dict(global_tokens=-2), 'model.longformer.global_tokens'),
    (dict(window='wide'), 'model.longformer.window'),
    (dict(windows=8), 'model.longformer.windows'),
])
def test_bad_config_names_its_key(keys, bad_key):
  with pytest.raises(ConfigError) as error:
    model_config(**keys)
  assert error.value.key == bad_key


def test_bad_scheduled_value_names_the_section_key():
  with pytest.raises(ConfigError, match=r'model\.longformer\.window: 0 must be >= 1'):
    resolve_model(dict(attention='longformer', num_layers=2,
                       layer_schedule={'longformer': {'window': '4,0'}}))


def test_old_flat_names_move_to_the_section():
  flat = dict(attention='longformer', window=8, dilation=1, head_dilations='1,1,2,2',
              block_size=4, global_tokens=2, global_projections=False, window_cache=False,
              rotary=False, layer_schedule={'window': '8,16,32,64'})
  values, moved = migrate_flat_model(flat)
  assert values == dict(attention='longformer', layer_schedule={'longformer': {
      'window': '8,16,32,64'}}, longformer=dict(
          window=8, dilation=1, head_dilations='1,1,2,2', block_size=4, global_tokens=2,
          global_projections=False, window_cache=False, rotary=False))
  assert ('window', 'longformer.window') in moved
  assert ('layer_schedule.window', 'layer_schedule.longformer.window') in moved
  with pytest.raises(ConfigError, match=r'model\.window: unknown key; it is now '
                                        r'model\.longformer\.window'):
    resolve_model(dict(attention='longformer', window=8))


def test_config_reading_and_cache_length():
  module = attention_layer(model_config(window=8, head_dilations='1:1:1 1'), jnp.float32)
  assert module.head_dilations == (1, 1, 1, 1) and module.shared.causal
  assert module.uses_window_cache
  assert module.config.window == 8 and module.rotary and module.config.global_projections
  state = attention_state(model_config(window=8, head_dilations='1,3,1,1'), 2)
  assert state.values.shape == (2, 24, D)
  dilated = attention_layer(model_config(dilation=2), jnp.float32)
  assert dilated.head_dilations == (2, 2, 2, 2)
  # Two-sided layers never cache (their window would need the next chunk's keys).
  encoder = model_config(window=8, causal=False)
  assert not attention_layer(encoder, jnp.float32).uses_window_cache
  assert LongformerAttention.init_state(encoder.longformer, SharedSettings.of(encoder),
                                        2).values.shape == (2, 0, D)
  no_cache = model_config(window=8, window_cache=False)
  assert attention_state(no_cache, 2).values.shape == (2, 0, D)

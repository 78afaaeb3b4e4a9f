"""Reformer LSH attention against independent dense references.

References: buckets by a float64 numpy argmax of [xR; -xR]; per round, the
tokens sorted by (bucket, position) with numpy and a Python loop over
(query, key) pairs that applies the Reformer rule (same bucket, own or
previous chunk of the sorted order, causal / document / padding, self only
at logit -1e5) as a dense `[rounds, n, n]` mask; rounds combined by a plain
float64 log-sum-exp. Gradients are held to a dense jnp computation over the
same mask.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.lsh.attention import (SELF_LOGIT, LSHAttention, hash_buckets,
                                          lsh_attention, random_rotations)
from longformer_jax.attention.registry import attention_class, attention_layer
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.resolved_model import ResolvedModel, resolved_model

B, N, H, D = 2, 32, 2, 8


def numpy_buckets(qk, rotations):
  """`[b, n, h, d]`, `[h, d, r, k]` -> `[b, h, r, n]` by argmax([xR; -xR]) in float64."""
  rotated = np.einsum('bnhd,hdrk->bhrnk', np.float64(qk), np.float64(rotations))
  return np.argmax(np.concatenate([rotated, -rotated], -1), -1)


def reference_mask(buckets, positions, segments, valid, chunk_len, causal):
  """`[b, h, r, n, n]` bool: may query i attend to key j in round r (loop over pairs)."""
  b, h, r, n = buckets.shape
  mask = np.zeros((b, h, r, n, n), bool)
  for bi in range(b):
    for hi in range(h):
      for ri in range(r):
        order = np.lexsort((np.arange(n), positions[bi], buckets[bi, hi, ri]))
        chunk_of = np.empty(n, int)
        chunk_of[order] = np.arange(n) // chunk_len
        for i in range(n):
          for j in range(n):
            mask[bi, hi, ri, i, j] = (
                buckets[bi, hi, ri, i] == buckets[bi, hi, ri, j]
                and chunk_of[j] in (chunk_of[i], chunk_of[i] - 1)
                and valid[bi, j] and segments[bi, i] == segments[bi, j]
                and (not causal or positions[bi, j] <= positions[bi, i]))
  return mask


def reference_logits(qk, positions, segments, xp):
  """`[b, h, n, n]` q_i . k_j / sqrt(d) with k = q / |q|, self replaced by SELF_LOGIT."""
  q = xp.swapaxes(qk, 1, 2)
  k = q / xp.linalg.norm(q, axis=-1, keepdims=True)
  logits = xp.einsum('bhid,bhjd->bhij', q, k) / np.sqrt(q.shape[-1])
  is_self = ((positions[:, :, None] == positions[:, None, :])
             & (segments[:, :, None] == segments[:, None, :]))[:, None]
  return xp.where(is_self, SELF_LOGIT, logits)


def reference_numpy(qk, v, positions, segments, mask):
  """float64: softmax per round over the mask, rounds combined by log-sum-exp."""
  qk, v = np.float64(qk), np.float64(v)
  logits = reference_logits(qk, positions, segments, np)[:, :, None]   # [b, h, 1, n, n]
  out = np.zeros(qk.shape)
  b, h, r, n, _ = mask.shape
  for bi in range(b):
    for hi in range(h):
      for i in range(n):
        lses, outs = [], []
        for ri in range(r):
          keys = np.nonzero(mask[bi, hi, ri, i])[0]
          if len(keys) == 0:
            continue
          scores = logits[bi, hi, 0, i, keys]
          lse = scores.max() + np.log(np.sum(np.exp(scores - scores.max())))
          lses.append(lse)
          outs.append(np.exp(scores - lse) @ v[bi, keys, hi])
        if lses:
          lses = np.array(lses)
          weights = np.exp(lses - lses.max()) / np.sum(np.exp(lses - lses.max()))
          out[bi, i, hi] = sum(w * o for w, o in zip(weights, outs))
  return out


def reference_jnp(qk, v, positions, segments, mask):
  """The same computation, dense and differentiable (float32)."""
  logits = reference_logits(qk, positions, segments, jnp)[:, :, None]
  logits = jnp.where(mask, logits, -jnp.inf)                         # [b, h, r, n, n]
  top = jax.lax.stop_gradient(jnp.max(logits, axis=(2, 4), keepdims=True))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  unnormalised = jnp.exp(logits - top)
  total = jnp.sum(unnormalised, axis=(2, 4), keepdims=True)
  weights = unnormalised / jnp.where(total > 0, total, 1.0)
  return jnp.einsum('bhrij,bjhd->bihd', weights, v)


def random_inputs(seed=0, doc_len=0, pad_tail=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  qk = jax.random.normal(keys[0], (B, N, H, D))
  v = jax.random.normal(keys[1], (B, N, H, D))
  positions = np.tile(np.arange(100, 100 + N, dtype=np.int32), (B, 1))
  segments = (np.arange(N)[None] // doc_len if doc_len else np.zeros((1, N), int))
  segments = np.tile(segments, (B, 1)).astype(np.int32)
  valid = np.ones((B, N), bool)
  if pad_tail:
    valid[1, -pad_tail:] = False
  return qk, v, positions, segments, valid


lsh = jax.jit(lsh_attention, static_argnames=('chunk_len', 'causal', 'logit_scale'))


@pytest.mark.parametrize('causal,logit_scale', [(True, 'inverse_sqrt_head_dim'),
                                                (False, 'inverse_sqrt_head_dim'), (True, 'none')])
def test_single_bucket_equals_full_shared_qk_attention(causal, logit_scale):
  """Zero rotations put every token in bucket 0; one chunk: full attention, self only if alone.

  Logits q . k_hat / sqrt(d), or q . k_hat with `logit_scale='none'` (trax, Hugging Face)."""
  divisor = {'inverse_sqrt_head_dim': np.sqrt(D), 'none': 1.0}[logit_scale]
  qk, v, positions, segments, valid = random_inputs(doc_len=12, pad_tail=5)
  rotations = jnp.zeros((H, D, 2, 1))
  out = lsh(qk, v, positions, segments, valid, rotations, chunk_len=N, causal=causal,
            logit_scale=logit_scale)
  # Independent reference: plain softmax over every allowed key except self,
  # self alone when no other key is allowed.
  q = np.float64(np.swapaxes(qk, 1, 2))
  k = q / np.linalg.norm(q, axis=-1, keepdims=True)
  expected = np.zeros((B, N, H, D))
  for b in range(B):
    for h in range(H):
      for i in range(N):
        others = [j for j in range(N) if j != i and valid[b, j] and segments[b, j] == segments[b, i]
                  and (not causal or j <= i)]
        keys = others or ([i] if valid[b, i] else [])
        if not keys:
          continue
        scores = np.array([q[b, h, i] @ k[b, h, j] for j in keys]) / divisor
        weights = np.exp(scores - scores.max())
        expected[b, i, h] = (weights / weights.sum()) @ np.float64(v)[b, keys, h]
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)


def test_hash_buckets_match_numpy_argmax():
  qk, *_ = random_inputs(seed=3)
  rotations = random_rotations(jax.random.PRNGKey(4), H, D, 3, 6)
  buckets = np.asarray(hash_buckets(qk, rotations))
  np.testing.assert_array_equal(buckets, numpy_buckets(qk, rotations))
  assert buckets.min() >= 0 and buckets.max() <= 5 and len(np.unique(buckets)) > 3


@pytest.mark.parametrize('causal,doc_len,pad_tail', [(True, 0, 0), (True, 12, 5), (False, 20, 3)])
def test_lsh_matches_dense_bucket_mask_reference(causal, doc_len, pad_tail):
  qk, v, positions, segments, valid = random_inputs(seed=1, doc_len=doc_len, pad_tail=pad_tail)
  rotations = random_rotations(jax.random.PRNGKey(5), H, D, 3, 4)
  out = lsh(qk, v, positions, segments, valid, rotations, chunk_len=8, causal=causal)
  mask = reference_mask(numpy_buckets(qk, rotations), positions, segments, valid, 8, causal)
  # The pattern is sparse but not trivial: some keys masked, most queries see others.
  assert 0.02 < mask.mean() < 0.5
  np.testing.assert_allclose(out, reference_numpy(qk, v, positions, segments, mask),
                             atol=2e-5, rtol=1e-4)


def test_lsh_gradients_match_dense_reference():
  qk, v, positions, segments, valid = random_inputs(seed=2, doc_len=12, pad_tail=4)
  rotations = random_rotations(jax.random.PRNGKey(6), H, D, 2, 4)
  mask = reference_mask(numpy_buckets(qk, rotations), positions, segments, valid, 8, True)
  cotangent = jax.random.normal(jax.random.PRNGKey(7), (B, N, H, D))

  def fast(qk, v):
    return jnp.sum(cotangent * lsh_attention(qk, v, positions, segments, valid, rotations,
                                             chunk_len=8, causal=True))

  def dense(qk, v):
    return jnp.sum(cotangent * reference_jnp(qk, v, positions, segments, mask))

  fast_value, fast_grads = jax.jit(jax.value_and_grad(fast, argnums=(0, 1)))(qk, v)
  dense_value, dense_grads = jax.jit(jax.value_and_grad(dense, argnums=(0, 1)))(qk, v)
  np.testing.assert_allclose(fast_value, dense_value, rtol=1e-5)
  for got, want in zip(fast_grads, dense_grads):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


def test_lsh_never_builds_an_n_by_n_array():
  n, chunk = 512, 16
  qk = jnp.zeros((1, n, H, D))
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  rotations = jnp.zeros((H, D, 2, 4))

  def loss(qk, v):
    return jnp.sum(lsh_attention(qk, v, positions, jnp.zeros_like(positions),
                                 jnp.ones((1, n), bool), rotations, chunk_len=chunk, causal=True))

  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(qk, qk)
  sizes = []

  def collect(jaxpr):
    for eqn in jaxpr.eqns:
      sizes.extend(int(np.prod(var.aval.shape)) for var in eqn.outvars
                   if hasattr(var.aval, 'shape'))
      for sub in jax.core.jaxprs_in_params(eqn.params):
        collect(sub)
  collect(jaxpr.jaxpr)
  # Largest array: the [1, heads, rounds * n / m, m, 2m] logits = 2 * rounds * m * n * heads.
  assert max(sizes) <= 2 * 2 * chunk * n * H < n * n * H / 4


def tiny_lsh_config(**lsh):
  """A resolved model config with `model.lsh` = 4 buckets, chunks of 8, and `lsh`."""
  return resolved_model(resolve_model(dict(
      attention='lsh', num_heads=H, head_dim=D, d_model=16,
      lsh=dict(dict(num_buckets=4, chunk_len=8), **lsh))))


def module_context(deterministic=True):
  positions = jnp.tile(jnp.arange(N, dtype=jnp.int32), (B, 1))
  return AttentionContext(positions=positions, segment_ids=jnp.zeros((B, N), jnp.int32),
                          reset=jnp.zeros((B,), bool), valid=jnp.ones((B, N), bool),
                          deterministic=deterministic)


class TwoLayers(nn.Module):
  """Two LSH layers side by side, to compare their rotations."""
  config: ResolvedModel

  @nn.compact
  def __call__(self, x, ctx):
    return [attention_layer(self.config, jnp.float32, name=f'layer_{i}')(x, {}, ctx)[0]
            for i in range(2)]


def test_module_rotations_fixed_per_layer_or_fresh_per_step():
  assert attention_class('lsh') is LSHAttention
  x = jax.random.normal(jax.random.PRNGKey(0), (B, N, 16))
  model = TwoLayers(tiny_lsh_config())
  params = model.init(jax.random.PRNGKey(1), x, module_context())
  # Both layers with the same parameters: different outputs only through rotations.
  same = {'params': {'layer_0': params['params']['layer_0'],
                     'layer_1': params['params']['layer_0']}}
  eval_a = model.apply(same, x, module_context())
  eval_b = model.apply(same, x, module_context(False), rngs={'dropout': jax.random.PRNGKey(9)})
  assert not np.allclose(eval_a[0], eval_a[1])                # per-layer rotations differ
  for a, b in zip(eval_a, eval_b):                            # fixed: train == eval
    np.testing.assert_allclose(a, b, rtol=1e-6)
  per_step = TwoLayers(tiny_lsh_config(rotations_per_step=True))
  def step(key):
    return per_step.apply(same, x, module_context(False), rngs={'dropout': key})
  assert not np.allclose(step(jax.random.PRNGKey(1))[0], step(jax.random.PRNGKey(2))[0])
  for a, b in zip(per_step.apply(same, x, module_context()), eval_a):  # eval: fixed rotations
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize('key,value', [('num_buckets', 3), ('num_buckets', 0),
                                       ('num_hashes', 0), ('chunk_len', 0),
                                       ('rotary', 'maybe'), ('num_bucket', 4),
                                       ('logit_scale', 'sqrt')])
def test_bad_lsh_config_names_the_key(key, value):
  with pytest.raises(ConfigError) as error:
    tiny_lsh_config(**{key: value})
  assert error.value.key == f'model.lsh.{key}'


@pytest.mark.parametrize('sections,bad', [
    (dict(data=dict(chunk_len=96)), '96'),                               # 96 = 1.5 x 64
    (dict(data=dict(chunk_len=64), eval=dict(chunk_len=100)), '100'),
    (dict(data=dict(chunk_len=48), train=dict(num_steps=4, phases=2)), '96'),   # phase 1: 96
])
def test_chunk_lengths_not_cut_into_lsh_chunks_are_refused(sections, bad):
  """Every chunk the model sees, if longer than lsh.chunk_len (64), is a multiple of it."""
  with pytest.raises(ConfigError, match=f'must divide every model chunk .* {bad} is not') as error:
    resolve_config(dict(model=dict(attention='lsh', lsh=dict(chunk_len=64)), **sections))
  assert error.value.key == 'model.lsh.chunk_len'


@pytest.mark.parametrize('sections', [
    dict(data=dict(chunk_len=128), eval=dict(chunk_len=256)),
    dict(data=dict(chunk_len=32)),                       # shorter: one LSH chunk of 32
    dict(data=dict(chunk_len=32), train=dict(num_steps=6, phases=3)),   # 32, 64, 128
])
def test_chunk_lengths_cut_into_lsh_chunks_are_accepted(sections):
  resolve_config(dict(model=dict(attention='lsh', lsh=dict(chunk_len=64)), **sections))


def test_old_flat_names_move_to_the_section():
  flat = dict(attention='lsh', lsh_num_buckets=4, lsh_num_hashes=3, lsh_chunk_len=16,
              lsh_seed=2, lsh_rotations_per_step=True, lsh_rotary=False)
  values, moved = migrate_flat_model(flat)
  assert values == dict(attention='lsh', lsh=dict(
      num_buckets=4, num_hashes=3, chunk_len=16, seed=2, rotations_per_step=True, rotary=False))
  assert ('lsh_num_buckets', 'lsh.num_buckets') in moved
  assert migrate_flat_model({'attention': 'lsh', 'lsh_num_buckets': 4})[0] == {
      'attention': 'lsh', 'lsh': {'num_buckets': 4}}


def test_config_reading():
  module = attention_layer(
      tiny_lsh_config(num_hashes=3, seed=2, rotations_per_step=True, rotary=False), jnp.float32)
  config = module.config
  assert (config.num_hashes, config.num_buckets, config.chunk_len, config.seed,
          config.rotations_per_step, config.rotary, module.shared.causal) == (3, 4, 8, 2, True,
                                                                              False, True)
  assert config.logit_scale == 'inverse_sqrt_head_dim'
  assert attention_layer(tiny_lsh_config(logit_scale='none'),
                         jnp.float32).config.logit_scale == 'none'


def test_bad_logit_scale_is_a_one_line_error_naming_key_and_value():
  with pytest.raises(ConfigError) as error:
    tiny_lsh_config(logit_scale='sqrt')
  message = str(error.value)
  assert message.startswith("config.model.lsh.logit_scale: 'sqrt' must be 'inverse_sqrt_head_dim'")
  assert "'none'" in message and '\n' not in message
  qk, v, positions, segments, valid = random_inputs()
  with pytest.raises(ConfigError, match=r"model\.lsh\.logit_scale: 'sqrt'"):
    lsh_attention(qk, v, positions, segments, valid, jnp.zeros((H, D, 1, 1)), chunk_len=8,
                  causal=True, logit_scale='sqrt')


def test_chunk_not_multiple_of_lsh_chunk_is_a_config_error():
  qk, v, positions, segments, valid = random_inputs()
  with pytest.raises(ConfigError, match='model.lsh.chunk_len'):
    lsh_attention(qk, v, positions, segments, valid, jnp.zeros((H, D, 1, 1)), chunk_len=12,
                  causal=True)


# The scanned path: several scan steps (groups of sorted chunks), the single-key
# sort with positions that restart per document, the payload sort it falls
# back to, and the blocked hashing, against the same references.

def documents_restarting_positions(seed):
  """Positions that restart at 0 in every document of 12 (packed sequences)."""
  qk, v, _, segments, valid = random_inputs(seed=seed, doc_len=12, pad_tail=3)
  positions = np.tile((np.arange(N) % 12).astype(np.int32), (B, 1))
  return qk, v, positions, segments, valid


@pytest.mark.parametrize('rows_per_step', [8, 16, 24, 1000])
@pytest.mark.parametrize('restart', [False, True])
def test_scan_steps_match_dense_reference(rows_per_step, restart):
  """1, 2, 3 or all chunks of 8 per scan step (12, 6, 4, 1 steps over 3 rounds)."""
  if restart:
    qk, v, positions, segments, valid = documents_restarting_positions(seed=8)
  else:
    qk, v, positions, segments, valid = random_inputs(seed=8, doc_len=20, pad_tail=3)
  rotations = random_rotations(jax.random.PRNGKey(9), H, D, 3, 4)
  run = jax.jit(lsh_attention, static_argnames=('chunk_len', 'causal', 'rows_per_step'))
  out = run(qk, v, positions, segments, valid, rotations, chunk_len=8, causal=True,
            rows_per_step=rows_per_step)
  mask = reference_mask(numpy_buckets(qk, rotations), positions, segments, valid, 8, True)
  np.testing.assert_allclose(out, reference_numpy(qk, v, positions, segments, mask),
                             atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize('rows_per_step', [8, 16])
def test_scan_steps_gradients_match_dense_reference(rows_per_step):
  """Key/value gradients of a step's first chunk's previous chunk cross steps (the carry)."""
  qk, v, positions, segments, valid = documents_restarting_positions(seed=10)
  rotations = random_rotations(jax.random.PRNGKey(11), H, D, 2, 4)
  mask = reference_mask(numpy_buckets(qk, rotations), positions, segments, valid, 8, False)
  cotangent = jax.random.normal(jax.random.PRNGKey(12), (B, N, H, D))

  def fast(qk, v):
    return jnp.sum(cotangent * lsh_attention(qk, v, positions, segments, valid, rotations,
                                             chunk_len=8, causal=False,
                                             rows_per_step=rows_per_step))

  def dense(qk, v):
    return jnp.sum(cotangent * reference_jnp(qk, v, positions, segments, mask))

  fast_value, fast_grads = jax.jit(jax.value_and_grad(fast, argnums=(0, 1)))(qk, v)
  dense_value, dense_grads = jax.jit(jax.value_and_grad(dense, argnums=(0, 1)))(qk, v)
  np.testing.assert_allclose(fast_value, dense_value, rtol=1e-5)
  for got, want in zip(fast_grads, dense_grads):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


def test_payload_sort_fallback_gives_the_same_output(monkeypatch):
  """Past the int32 range of bucket * n + rank, the (bucket, position, slot) sort."""
  import longformer_jax.attention.lsh.attention as lsh_module
  qk, v, positions, segments, valid = documents_restarting_positions(seed=13)
  rotations = random_rotations(jax.random.PRNGKey(14), H, D, 3, 4)
  args = (qk, v, positions, segments, valid, rotations)
  single = lsh_attention(*args, chunk_len=8, causal=True, rows_per_step=16)
  monkeypatch.setattr(lsh_module, 'SINGLE_KEY_SORT_LIMIT', 0)
  payload = lsh_attention(*args, chunk_len=8, causal=True, rows_per_step=16)
  np.testing.assert_array_equal(single, payload)


def test_blocked_hash_buckets_match_numpy_argmax():
  qk, *_ = random_inputs(seed=15)
  rotations = random_rotations(jax.random.PRNGKey(16), H, D, 3, 6)
  for block in (8, 16, N):
    np.testing.assert_array_equal(hash_buckets(qk, rotations, block=block),
                                  numpy_buckets(qk, rotations))

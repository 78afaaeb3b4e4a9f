"""ETC global-local attention (blocked) against float64 references built pair by pair.

The reference follows Ainslie et al. (2020), section 3, as laid out in
attention/etc.py: in plain Python it picks the global tokens (the first
`max_global` flagged real tokens), finds each token's sentence (the latest
global token at or before it in its document) by scanning positions, orders
the tokens as [global; long], and decides for every (query, key) pair which
piece it is (g2g, g2l, l2g, l2l), whether the pair is allowed and its
relative label. Softmax attention with the labels' key vectors is then taken
in numpy float64 (outputs) and, for gradients, by a dense jax function over
the same constant mask and labels. Inputs have a document boundary, padding
(with a flag on a padded token), lengths that are and are not multiples of
the block, and more flagged tokens than `max_global` in one case.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import etc_cases
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.etc import ETCAttention, ETCConfig, etc_attention, num_labels
from longformer_jax.attention.registry import attention_layer
from longformer_jax.config.errors import ConfigError
from tests.support.gradient_checks import assert_gradients_match
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config

B, D, H, HD = 2, 32, 2, 16
START = 40     # stream position of the chunk's first token


# ------------------------------------------------------------------ reference


def reference_pairs(positions, segments, valid, flags, *, radius, max_global, structure,
                    causal):
  """`(allowed [b, n, n] bool, labels [b, n, n] int)` over chunk slots, one pair at a time."""
  b, n = positions.shape
  same_label, other_label = 2 * radius + 1, 2 * radius + 2
  clip = lambda d: min(max(d, -radius), radius) + radius
  allowed = np.zeros((b, n, n), bool)
  labels = np.zeros((b, n, n), np.int64)
  for row in range(b):
    pos, seg = [int(p) for p in positions[row]], [int(s) for s in segments[row]]
    chosen = [t for t in range(n) if flags[row, t] and valid[row, t]][:max_global]
    rank = {t: r for r, t in enumerate(chosen)}
    sentence = {}
    for t in range(n):
      before = [g for g in chosen if pos[g] <= pos[t] and seg[g] == seg[t]]
      sentence[t] = rank[max(before, key=lambda g: pos[g])] if before else -1
    order = chosen + [t for t in range(n) if t not in rank]      # [global; long]
    for i in order:
      for j in order:
        ok = valid[row, j] and seg[i] == seg[j] and (not causal or pos[j] <= pos[i])
        if i in rank and j in rank:                                 # g2g
          label = clip(rank[j] - rank[i])
        elif i in rank:                                             # g2l
          linked = rank[i] == sentence[j]
          ok = ok and (structure == 'all' or linked)
          label = same_label if linked else other_label
        elif j in rank:                                             # l2g
          linked = sentence[i] == rank[j]
          ok = ok and (structure == 'all' or linked)
          label = same_label if linked else other_label
        else:                                                       # l2l
          ok = ok and abs(pos[j] - pos[i]) <= radius
          label = clip(pos[j] - pos[i])
        allowed[row, i, j] = ok
        labels[row, i, j] = label
  return allowed, labels


def numpy_attention(q, k, v, rel_keys, allowed, labels):
  """float64: e_ij = q_i . (k_j + a_{l_ij}) (q scaled), rows with no key give 0."""
  q, k, v, a = (np.asarray(t, np.float64) for t in (q, k, v, rel_keys))
  b, n, h, _ = q.shape
  out = np.zeros_like(q)
  for row in range(b):
    for head in range(h):
      for i in range(n):
        keys = [j for j in range(n) if allowed[row, i, j]]
        if not keys:
          continue
        scores = np.array([q[row, i, head] @ (k[row, j, head] + a[labels[row, i, j], head])
                           for j in keys])
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        out[row, i, head] = sum(w * v[row, j, head] for w, j in zip(weights, keys))
  return out


def dense_jax_attention(q, k, v, rel_keys, allowed, labels):
  """Differentiable dense reference (float32) over constant numpy `allowed` and `labels`."""
  rel = jnp.einsum('bqhd,bqkhd->bhqk', q, rel_keys[labels])
  scores = jnp.where(allowed[:, None], jnp.einsum('bqhd,bkhd->bhqk', q, k) + rel, -1e30)
  weights = jax.nn.softmax(scores, axis=-1) * allowed[:, None].any(-1, keepdims=True)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, v)


def chunk_facts(n: int, many_flags: bool = False):
  """Row 0: one document, sentences at slots 0, 5, 9; row 1: a new document at slot 6,
  flags at 2 and 7, the last 3 slots padding (the last one flagged)."""
  positions = np.tile(np.arange(START, START + n, dtype=np.int32), (B, 1))
  segments = np.zeros((B, n), np.int32)
  segments[1, 6:] = 1
  valid = np.ones((B, n), bool)
  valid[1, -3:] = False
  flags = np.zeros((B, n), bool)
  flags[0, [0, 5, 9]] = True
  flags[1, [2, 7, n - 1]] = True
  if many_flags:
    flags[0, [1, 11]] = True
  return positions, segments, valid, flags


def run_fast(q, k, v, rel_keys, facts, **settings):
  positions, segments, valid, flags = (jnp.asarray(a) for a in facts)
  return etc_attention(q, k, v, rel_keys, positions, segments, valid, flags, **settings)


def random_inputs(n: int, radius: int, seed: int = 0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k, v, cotangent = (jax.random.normal(key, (B, n, H, HD)) for key in keys[:4])
  rel_keys = 0.5 * jax.random.normal(keys[4], (num_labels(radius), H, HD))
  return q / np.sqrt(HD), k, v, rel_keys, cotangent


# (radius, max_global, structure, causal, n, many_flags): radius >= n with 'all' is full
# attention over [global; long]; radius 4 with 'sentence' at n = 16 and 13 (block 4).
CASES = [
    pytest.param(32, 8, 'all', False, 16, False, id='full-all-16'),
    pytest.param(16, 8, 'all', False, 13, False, id='full-all-13'),
    pytest.param(4, 8, 'sentence', False, 16, False, id='r4-sentence-16'),
    pytest.param(4, 8, 'sentence', False, 13, False, id='r4-sentence-13'),
    pytest.param(3, 4, 'sentence', False, 13, True, id='r3-sentence-13-capped'),
    pytest.param(4, 8, 'all', False, 13, False, id='r4-all-13'),
    pytest.param(4, 8, 'sentence', True, 13, False, id='r4-sentence-13-causal'),
    pytest.param(2, 0, 'sentence', False, 13, False, id='r2-no-global-13'),
]


@pytest.mark.parametrize('radius,max_global,structure,causal,n,many_flags', CASES)
def test_blocked_equals_float64_pairwise_reference(radius, max_global, structure, causal, n,
                                                   many_flags):
  facts = chunk_facts(n, many_flags)
  settings = dict(radius=radius, max_global=max_global, structure=structure, causal=causal)
  q, k, v, rel_keys, cotangent = random_inputs(n, radius)
  got = jax.jit(lambda *a: run_fast(*a, facts, **settings))(q, k, v, rel_keys)
  allowed, labels = reference_pairs(*facts, **settings)
  np.testing.assert_allclose(np.asarray(got), numpy_attention(q, k, v, rel_keys, allowed, labels),
                             rtol=2e-4, atol=2e-5)
  assert_gradients_match(lambda *a: jnp.sum(run_fast(*a, facts, **settings) * cotangent),
                         lambda *a: jnp.sum(dense_jax_attention(*a, allowed, labels) * cotangent),
                         (q, k, v, rel_keys))


def test_reference_structure_is_what_the_cases_claim():
  """Sanity of the cases: a long token's l2g keys are its sentence's global only, and the
  capped case really drops flagged tokens (they stay long)."""
  facts = chunk_facts(13)
  allowed, _ = reference_pairs(*facts, radius=4, max_global=8, structure='sentence',
                               causal=False)
  assert list(np.nonzero(allowed[0, 7, [0, 5, 9]])[0]) == [1]      # slot 7 is in sentence 5
  assert not allowed[1, 4, 7] and allowed[1, 8, 7]                  # documents; row 1 sentence 7
  capped, _ = reference_pairs(*chunk_facts(13, True), radius=3, max_global=4,
                              structure='sentence', causal=False)
  assert capped[0, 11, 10] and not capped[0, 11, 3]                 # 11 is long: window only


def context_for(facts) -> AttentionContext:
  positions, segments, valid, flags = (jnp.asarray(a) for a in facts)
  return AttentionContext(positions=positions, segment_ids=segments, reset=jnp.zeros((B,), bool),
                          valid=valid, global_flags=flags)


def test_layer_matches_float64_reference():
  """The module: shared projections, the learned label vectors, output projection."""
  n, radius = 13, 4
  module = ETCAttention(config=ETCConfig(radius=radius, max_global=8, structure='sentence'),
                        shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=False))
  facts = chunk_facts(n)
  x = jax.random.normal(jax.random.PRNGKey(7), (B, n, D))
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, {}, context_for(facts))['params']
  y, state, aux = jax.jit(module.apply)({'params': params}, x, {}, context_for(facts))
  assert state == {} and aux == {}
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  x64 = np.asarray(x, np.float64)
  project = lambda name: np.einsum('bnd,dhe->bnhe', x64, p[name]['kernel'])
  allowed, labels = reference_pairs(*facts, radius=radius, max_global=8, structure='sentence',
                                    causal=False)
  out = numpy_attention(project('query') / np.sqrt(HD), project('key'), project('value'),
                        p['relative_keys'], allowed, labels)
  expected = np.einsum('bnhe,hed->bnd', out, p['out']['kernel'])
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def test_fully_masked_row_gives_zeros():
  facts = list(chunk_facts(13))
  facts[2] = facts[2].copy()
  facts[2][0] = False
  q, k, v, rel_keys, _ = random_inputs(13, 4)
  out = jax.jit(lambda *a: run_fast(*a, facts, radius=4, max_global=8, structure='all'))(
      q, k, v, rel_keys)
  assert np.all(np.asarray(out[0]) == 0) and np.abs(np.asarray(out[1])).sum() > 0


def test_no_global_flags_is_the_window_alone():
  """A decoder LM passes no global flags: the same as flags with max_global = 0."""
  facts = chunk_facts(13)
  q, k, v, rel_keys, _ = random_inputs(13, 4)
  settings = dict(radius=4, structure='sentence', causal=True)
  positions, segments, valid, flags = (jnp.asarray(a) for a in facts)
  none = jax.jit(lambda *a: etc_attention(*a, positions, segments, valid, None, max_global=8,
                                          **settings))(q, k, v, rel_keys)
  np.testing.assert_array_equal(np.asarray(none),
                                np.asarray(run_fast(q, k, v, rel_keys, facts, max_global=0,
                                                    **settings)))


def test_forward_and_backward_never_build_an_n_by_n_array():
  n, radius, num_global = 1024, 32, 16
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  flags = (jnp.arange(n) % 64 == 0)[None]
  q = jnp.ones((1, n, 1, 8))
  rel_keys = jnp.ones((num_labels(radius), 1, 8))

  def loss(q, k, v, a):
    return jnp.sum(etc_attention(q, k, v, a, positions, jnp.zeros_like(positions),
                                 jnp.ones((1, n), bool), flags, radius=radius,
                                 max_global=num_global, structure='sentence'))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2, 3)), q, q, q, rel_keys)
  # Three blocks of `radius` keys per long query, plus G globals; G x n for the globals.
  assert largest <= n * (3 * radius + num_global) < n * n // 4, largest


def test_benchmark_fast_case_equals_dense_mask_case():
  cases = {case.variant: case for case in etc_cases.CASES}
  inputs = cases['etc_blocked'].make_inputs(640, jax.random.PRNGKey(3))
  fast = np.asarray(jax.jit(cases['etc_blocked'].forward)(*inputs))
  dense = np.asarray(jax.jit(cases['etc_dense_mask'].forward)(*inputs))
  np.testing.assert_allclose(fast, dense, atol=2e-5)


# --------------------------------------------------------------------- config


@pytest.mark.parametrize('key,section', [
    ('model.etc.radius', dict(radius=0)),
    ('model.etc.max_global', dict(max_global=-1)),
    ('model.etc.structure', dict(structure='paragraph')),
    ('model.etc.window', dict(window=4)),
])
def test_bad_settings_name_their_key(key, section):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='etc', etc=section)
  assert error.value.key == key


def test_bad_value_message_names_value_and_rule():
  with pytest.raises(ConfigError, match=r"model\.etc\.structure: 'paragraph' must be one of"):
    tiny_config(attention='etc', etc=dict(structure='paragraph'))


def test_config_reading():
  cfg = tiny_model_config(attention='etc', causal=False,
                          etc=dict(radius=5, max_global=3, structure='sentence'))
  module = attention_layer(cfg, jnp.float32)
  assert (module.config.radius, module.config.max_global, module.config.structure,
          module.shared.causal) == (5, 3, 'sentence', False)

"""Performer (FAVOR+) attention against independent references.

- With the same random features W, the blocked prefix-sum path (causal) and
  the two-scan path (bidirectional) equal dense masked linear attention: the
  n x n matrix phi(Q) phi(K)^T in float64 numpy with unshifted features, a
  mask built pair by pair by Python loops from the causal, document and
  padding rule; gradients against the same dense computation in JAX. Lengths
  that are and are not multiples of the block, a document starting inside a
  chunk, padding at the end of a row, a query with no key (gives 0).
- The carried state over two chunks equals one long chunk; reset and a
  feature redraw clear it.
- Softmax-kernel features are unbiased (mean over independent draws within a
  statistical bound of exp(q.k / sqrt(d))); the output error against exact
  softmax attention falls as m^-1/2.
- The ReLU kernel against its dense reference; no n x n array; the
  benchmark case equals its dense-mask case. The layer (projections, state,
  redraw schedule, config errors): tests/attention/test_performer_layer.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import performer_cases
from longformer_jax.attention.performer import attention as performer
from longformer_jax.attention.performer import kernel as performer_kernel
from longformer_jax.attention.performer import random_features
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.performer_reference import (B, BLOCK, EPS, H, HD, M, chunk_facts, jit,
                                               reference_attention, reference_mask)


# ------------------------------------------------------------------ references


def dense_jax_attention(q, k, v, w, allowed, kernel='softmax'):
  """The same dense computation in JAX float32 (for gradients), unshifted features."""
  if kernel == 'relu':
    phi = lambda x: random_features.relu_features(x, w, EPS)  # noqa: E731
  else:
    phi = lambda x: random_features.positive_softmax_features(x, w)  # noqa: E731
  a = jnp.einsum('bqhm,bkhm->bhqk', phi(q), phi(k)) * allowed[:, None]
  den = jnp.swapaxes(a.sum(-1), 1, 2)[..., None]
  out = jnp.einsum('bhqk,bkhe->bqhe', a, v)
  return jnp.where(den > 0, out / jnp.where(den > 0, den, 1.0), 0.0)


def assert_gradients_match(fast_loss, reference_loss, args, *, rtol=1e-4, atol=1e-5):
  """As tests/support/gradient_checks.py, both gradients compiled for compile speed
  (FAST_COMPILE)."""
  argnums = tuple(range(len(args)))
  got = jit(jax.grad(fast_loss, argnums=argnums))(*args)
  expected = jit(jax.grad(reference_loss, argnums=argnums))(*args)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=atol)


def random_qkv(n: int, seed: int, scale: float = 1.0):
  return tuple(scale * jax.random.normal(jax.random.PRNGKey(seed + i), (B, n, H, HD))
               for i in range(3))


def features(m: int = M, seed: int = 7, norm: str = 'chi') -> jax.Array:
  return random_features.random_feature_matrix(jax.random.PRNGKey(seed), m, HD, norm)


def empty(m: int = M) -> performer.PerformerState:
  return performer.empty_state(B, H, m, HD)


def fast_fn(q, k, v, positions, segments, valid, w, carry, kernel='softmax', causal=True):
  if causal:
    return performer.causal_performer_attention(q, k, v, positions, segments, valid, w, carry,
                                                kernel=kernel, block_len=BLOCK, relu_eps=EPS)
  return performer.bidirectional_performer_attention(q, k, v, positions, segments, valid, w,
                                                     kernel=kernel, block_len=BLOCK,
                                                     relu_eps=EPS), carry


fast = jit(fast_fn, static_argnames=('kernel', 'causal'))


# ------------------------------------------------- fast path = dense reference


CASES = [('softmax', True, 16), ('softmax', True, 13), ('softmax', False, 16),
         ('softmax', False, 13), ('relu', True, 13), ('relu', False, 13)]


@pytest.mark.parametrize('kernel,causal,n', CASES)
def test_matches_dense_reference(kernel, causal, n):
  positions, segments, valid = chunk_facts(n)
  q, k, v = random_qkv(n, seed=n)
  w = features()
  out, _ = fast(q, k, v, positions, segments, valid, w, empty(), kernel=kernel, causal=causal)
  allowed = reference_mask(positions, segments, valid, causal)
  expected = reference_attention(q, k, v, w, allowed, kernel)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-5, atol=2e-6)
  if causal:
    np.testing.assert_array_equal(np.asarray(out[0, 0]), 0.0)   # query 0 of row 0: no key


@pytest.mark.parametrize('kernel,causal,n', [('softmax', True, 13), ('softmax', False, 16),
                                             ('relu', True, 16)])
def test_gradients_match_dense_reference(kernel, causal, n):
  positions, segments, valid = chunk_facts(n)
  q, k, v = random_qkv(n, seed=2 * n)
  cotangent = jax.random.normal(jax.random.PRNGKey(5), q.shape)
  w = features()
  allowed = jnp.asarray(reference_mask(positions, segments, valid, causal), jnp.float32)

  def fast_loss(q, k, v):
    out, _ = fast_fn(q, k, v, positions, segments, valid, w, empty(), kernel=kernel,
                     causal=causal)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, w, allowed, kernel)  # noqa
                                       * cotangent)
  assert_gradients_match(fast_loss, dense_loss, (q, k, v), rtol=1e-4, atol=2e-5)


# ---------------------------------- bidirectional rows of one document (an encoder's rows)


def test_one_document_per_row_reads_the_valid_keys_only():
  positions, segments, valid = chunk_facts(13)                 # documents start at 9 and 6
  assert not performer_kernel.one_document_per_row(segments, valid)
  _, segments, valid = chunk_facts(13, boundaries=(13, 10))    # row 1: 3 padded slots alone
  assert performer_kernel.one_document_per_row(segments, valid)
  assert performer_kernel.one_document_per_row(segments, np.zeros_like(valid))   # no keys at all


@pytest.mark.parametrize('kernel_name,key_scale', [('softmax', 1.0), ('softmax', 4.0),
                                                   ('relu', 1.0)])
def test_rows_of_one_document_match_dense_reference(kernel_name, key_scale):
  """The whole-row sums (no scan) against the dense reference, outputs and gradients; row 0's
  first slot is padding, row 1's last 3 are padding of a document without keys (their
  queries read nothing: 0); key_scale 4 spreads the keys' log-features over ~60 nats."""
  n = 13
  positions, segments, valid = chunk_facts(n, boundaries=(n, n - 3))
  q, k, v = random_qkv(n, seed=4)
  k = k * jnp.linspace(1.0, key_scale, n)[None, :, None, None]
  w = features()
  out, _ = fast(q, k, v, positions, segments, valid, w, empty(), kernel=kernel_name,
                causal=False)
  allowed = reference_mask(positions, segments, valid, causal=False)
  np.testing.assert_allclose(np.asarray(out), reference_attention(q, k, v, w, allowed,
                                                                  kernel_name),
                             rtol=1e-4 if key_scale > 1 else 2e-5, atol=2e-6)
  np.testing.assert_array_equal(np.asarray(out[1, n - 3:]), 0.0)
  cotangent = jax.random.normal(jax.random.PRNGKey(8), q.shape)
  fast_loss = lambda q, k, v: jnp.sum(fast_fn(q, k, v, positions, segments, valid, w,  # noqa
                                              empty(), kernel=kernel_name,
                                              causal=False)[0] * cotangent)
  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(  # noqa: E731
      q, k, v, w, jnp.asarray(allowed, jnp.float32), kernel_name) * cotangent)
  assert_gradients_match(fast_loss, dense_loss, (q, k, v), rtol=1e-4, atol=2e-5)


def test_carried_state_over_two_chunks_equals_one_long_chunk():
  """Chunk A (12 tokens, row 1's document starts at 6) then chunk B (9, row 0's at 14)."""
  n_a, n = 12, 21
  positions, segments, valid = chunk_facts(n, boundaries=(14, 6), padding=(0, 2))
  q, k, v = random_qkv(n, seed=11)
  w = features()
  first = lambda a: a[:, :n_a]  # noqa: E731
  second = lambda a: a[:, n_a:]  # noqa: E731
  facts = (positions, segments, valid)
  out_a, carry = fast(*map(first, (q, k, v)), *map(first, facts), w, empty())
  out_b, _ = fast(*map(second, (q, k, v)), *map(second, facts), w, carry)
  expected = reference_attention(q, k, v, w, reference_mask(*facts))
  np.testing.assert_allclose(np.concatenate([out_a, out_b], axis=1), expected,
                             rtol=2e-5, atol=2e-6)
  # Gradients of chunk B wrt its own inputs (the carry is a constant of chunk B).
  allowed = jnp.asarray(reference_mask(*facts), jnp.float32)
  cotangent = jax.random.normal(jax.random.PRNGKey(6), (B, n - n_a, H, HD))

  def fast_loss(qb, kb, vb):
    return jnp.sum(fast_fn(qb, kb, vb, *map(second, facts), w, carry)[0] * cotangent)

  def dense_loss(qb, kb, vb):
    joined = [jnp.concatenate([first(a), b], axis=1) for a, b in zip((q, k, v), (qb, kb, vb))]
    return jnp.sum(second(dense_jax_attention(*joined, w, allowed)) * cotangent)
  assert_gradients_match(fast_loss, dense_loss, tuple(map(second, (q, k, v))), atol=2e-5)


def test_a_large_key_logit_range_stays_exact():
  """Keys whose log-features span ~60 nats (the shift keeps exp in range) and late large keys."""
  n = 16
  positions, segments, valid = chunk_facts(n)
  q, k, v = random_qkv(n, seed=3)
  k = k * jnp.linspace(0.2, 4.0, n)[None, :, None, None]
  w = features()
  out, _ = fast(q, k, v, positions, segments, valid, w, empty())
  expected = reference_attention(q, k, v, w, reference_mask(positions, segments, valid))
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('causal', [True, False])
def test_a_query_and_keys_strong_on_different_features_keep_their_normaliser(causal):
  """Two orthogonal features: the query's log-features are [150, -50], every key's [-50, 150].
  With one key shift for all features the normaliser underflowed to 0 (output 0, and in
  training a NaN gradient); per-feature key shifts keep it exact: the mean of the values."""
  w = 20.0 * jnp.eye(HD)[:2]                                  # W [2, d], rows of norm 20
  scale = HD ** 0.25                                          # x' = x / d^(1/4)
  strong = lambda axis: 10.0 * scale * jnp.eye(HD)[axis]      # noqa: E731  x' = 10 e_axis
  k = jnp.broadcast_to(strong(1), (1, 2, 1, HD))
  q = jnp.stack([strong(1), strong(0)])[None, :, None]        # [1, 2, 1, d]
  v = jax.random.normal(jax.random.PRNGKey(0), (1, 2, 1, HD))
  positions = jnp.arange(2, dtype=jnp.int32)[None]
  facts = (positions, jnp.zeros_like(positions), jnp.ones((1, 2), bool), w)

  def attention(q, k, v):
    if causal:
      return performer.causal_performer_attention(q, k, v, *facts,
                                                  performer.empty_state(1, 1, 2, HD))[0]
    return performer.bidirectional_performer_attention(q, k, v, *facts)
  out = jax.jit(attention)(q, k, v)
  np.testing.assert_allclose(np.asarray(out[0, 1, 0]), np.asarray(v[0].mean(0)[0]), rtol=1e-5,
                             atol=1e-6)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(attention(*a)), argnums=(0, 1, 2)))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


# --------------------------------------------------------- the random features


def test_feature_matrix_is_orthogonal_in_blocks():
  w = np.asarray(random_features.random_feature_matrix(jax.random.PRNGKey(0), 40, HD, 'chi'),
                 np.float64)
  for block in (w[:HD], w[HD:2 * HD], w[2 * HD:]):
    gram = block @ block.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-4)
  fixed = np.asarray(random_features.random_feature_matrix(jax.random.PRNGKey(0), 40, HD,
                                                           'sqrt_d'))
  np.testing.assert_allclose(np.linalg.norm(fixed, axis=-1), np.sqrt(HD), rtol=1e-5)
  assert np.std(np.linalg.norm(w, axis=-1)) > 0.2           # chi norms vary


@pytest.mark.parametrize('orthogonal', [True, False])
def test_softmax_kernel_estimate_is_unbiased(orthogonal):
  """Mean of phi(q) . phi(k) over N independent draws is within 4 standard errors of the kernel."""
  draws, m = 2000, 16
  keys = jax.random.split(jax.random.PRNGKey(123), draws)
  ws = np.asarray(jax.vmap(lambda key: random_features.random_feature_matrix(
      key, m, HD, 'chi', orthogonal=orthogonal))(keys), np.float64)      # [draws, m, d]

  def phi(x):  # the paper's positive features, float64, one row per draw
    x = x * HD ** -0.25
    return np.exp(ws @ x - 0.5 * x @ x) / np.sqrt(m)
  rng = np.random.default_rng(0)
  for _ in range(4):
    q, k = rng.normal(size=HD) * 0.7, rng.normal(size=HD) * 0.7
    estimates = np.sum(phi(q) * phi(k), axis=-1)
    exact = np.exp(q @ k / np.sqrt(HD))
    error = abs(estimates.mean() - exact)
    assert error < 4 * estimates.std() / np.sqrt(draws), (error, estimates.std(), exact)


@pytest.mark.slow
def test_attention_error_falls_as_inverse_sqrt_features():
  """Mean |FAVOR+ - softmax attention| at m = 16 over m = 256 is near sqrt(256 / 16) = 4.

  Queries and keys of moderate norm: the estimator's variance grows as
  exp(|q + k|^2 / sqrt(d)) (the paper's Lemma 2), and with large norms m = 256
  is not yet in the m^-1/2 regime (the ratio is ~1.9 at 0.8 x N(0, I)).
  """
  n, seeds = 32, 8
  positions = np.tile(np.arange(n, dtype=np.int32), (B, 1))
  segments, valid = np.zeros((B, n), np.int32), np.ones((B, n), bool)
  allowed = reference_mask(positions, segments, valid)
  errors = {}
  for m in (16, 256):
    total = 0.0
    for seed in range(seeds):
      q, k, v = random_qkv(n, seed=100 + seed)
      q, k = 0.3 * q, 0.3 * k
      w = random_features.random_feature_matrix(jax.random.PRNGKey(seed), m, HD, 'chi')
      out, _ = fast(q, k, v, positions, segments, valid, w, empty(m))
      logits = np.einsum('bqhe,bkhe->bhqk', np.asarray(q, np.float64),
                         np.asarray(k, np.float64)) / np.sqrt(HD)
      weights = np.exp(np.where(allowed[:, None], logits, -np.inf))
      weights /= weights.sum(-1, keepdims=True)
      exact = np.einsum('bhqk,bkhe->bqhe', weights, np.asarray(v, np.float64))
      total += np.abs(np.asarray(out) - exact).mean()
    errors[m] = total / seeds
  ratio = errors[16] / errors[256]
  assert 2.5 < ratio < 6.5, (errors, ratio)


# ------------------------------------------------------------- no n x n array

@pytest.mark.parametrize('causal', [True, False])
def test_forward_and_backward_never_build_an_n_by_n_array(causal):
  n, m, block = 1024, 16, 32
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  segments, valid = jnp.zeros_like(positions), jnp.ones((1, n), bool)
  w = random_features.random_feature_matrix(jax.random.PRNGKey(0), m, 8)
  x = jnp.ones((1, n, 1, 8))

  def loss(q, k, v):
    if causal:
      out, _ = performer.causal_performer_attention(q, k, v, positions, segments, valid, w,
                                                    performer.empty_state(1, 1, m, 8),
                                                    block_len=block)
    else:
      out = performer.bidirectional_performer_attention(q, k, v, positions, segments, valid, w,
                                                        block_len=block)
    return jnp.sum(out)
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2)), x, x, x)
  assert largest <= n * max(m, block) < n * n // 16, largest


# ------------------------------------------------------------------ benchmark


def test_benchmark_fast_case_equals_its_dense_mask_case():
  cases = {case.variant: case for case in performer_cases.CASES}
  inputs = cases['performer_causal_blocked'].make_inputs(200, jax.random.PRNGKey(0))
  fast_out = jit(cases['performer_causal_blocked'].forward)(*inputs)
  dense_out = jit(cases['performer_causal_dense_mask'].forward)(*inputs)
  np.testing.assert_allclose(np.asarray(fast_out), np.asarray(dense_out), rtol=1e-4, atol=2e-5)

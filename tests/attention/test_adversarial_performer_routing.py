"""Adversarial inputs for Performer and Routing attention against float64 references.

Performer (softmax kernel): keys whose log-features lie 98 to 300 nats apart.
A query that sees only far keys must get their values, wherever the keys it
cannot see lie: later in its block (causal), in another document of the
chunk, or before a document boundary in the carry. The in-block limit of the
causal scan (exact for spreads up to `140.0` nats within
one document and one block) is tested at that limit; across blocks, chunks
and documents there is none. Reference: `tests/support/performer_reference.py`'s dense
float64 linear attention from the paper's unshifted features.

Routing: padded tokens whose cluster ids, positions and documents look valid
are neither queries (their rows are exactly 0) nor keys; reference:
`tests/support/routing_reference.py`'s pair-by-pair float64 mask.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.performer import attention as performer
from tests.support import routing_reference as routing_refs
from tests.support.performer_reference import jit, reference_attention, reference_mask

# ------------------------------------------------------------------ Performer

# d = 2, m = 1, W = [[1, 0]], q = 0: the key (0, y 2^(1/4)) has log-feature -y^2 / 2 exactly.
W1 = jnp.array([[1.0, 0.0]])
V2 = np.array([[1.0, 2.0], [3.0, 4.0]])
Q2 = jnp.zeros((1, 2, 1, 2))                                  # q = 0: a query sees keys alike


def keys_with_log_features(logs) -> jnp.ndarray:
  """`[1, n, 1, 2]` keys whose (only) log-feature under W1 is `logs[j]` <= 0."""
  y = np.sqrt(-2.0 * np.asarray(logs, np.float64)) * 2 ** 0.25
  return jnp.asarray(np.stack([np.zeros_like(y), y], -1)[None, :, None], jnp.float32)


def facts(n, segments=None):
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  segments = jnp.zeros((1, n), jnp.int32) if segments is None else jnp.asarray([segments])
  return positions, segments.astype(jnp.int32), jnp.ones((1, n), bool)


def attention(q, k, v, positions, segments, valid, w, causal, block_len):
  if causal:
    carry = performer.empty_state(1, 1, w.shape[0], v.shape[-1])
    return performer.causal_performer_attention(q, k, v, positions, segments, valid, w, carry,
                                                block_len=block_len)[0]
  return performer.bidirectional_performer_attention(q, k, v, positions, segments, valid, w,
                                                     block_len=block_len)


attend = jit(attention, static_argnames=('causal', 'block_len'))


def expected(q, k, v, w, positions, segments, valid, causal):
  allowed = reference_mask(*(np.asarray(a) for a in (positions, segments, valid)), causal)
  return reference_attention(q, k, v, w, allowed)


def assert_finite_gradients(q, k, v, *args):
  loss = lambda q, k, v: jnp.sum(attention(q, k, v, *args) ** 2)  # noqa: E731
  grads = jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


@pytest.mark.parametrize('block_len', [1, 2, 64])
def test_a_far_key_before_a_near_key_of_its_block(block_len):
  """Causal, one document, log-features [-98, 0]: query 0 sees only the far key."""
  k, v, q = keys_with_log_features([-98.0, 0.0]), jnp.asarray(V2[None, :, None]), Q2
  out = attend(q, k, v, *facts(2), W1, causal=True, block_len=block_len)
  np.testing.assert_allclose(np.asarray(out[0, :, 0]), V2, rtol=1e-6)
  assert_finite_gradients(q, k, v, *facts(2), W1, True, block_len)


@pytest.mark.parametrize('causal,block_len', [(False, 64), (False, 1), (True, 1), (True, 2),
                                              (True, 64)])
@pytest.mark.parametrize('order', ['near_far', 'far_near'])
def test_each_document_of_a_chunk_has_its_own_shift(causal, block_len, order):
  """Two documents of one key each, log-features 0 and -98 (either order): each query gets
  its own document's value."""
  logs = [0.0, -98.0] if order == 'near_far' else [-98.0, 0.0]
  k, v, q = keys_with_log_features(logs), jnp.asarray(V2[None, :, None]), Q2
  out = attend(q, k, v, *facts(2, [0, 1]), W1, causal=causal, block_len=block_len)
  np.testing.assert_allclose(np.asarray(out[0, :, 0]), V2, rtol=1e-6)
  assert_finite_gradients(q, k, v, *facts(2, [0, 1]), W1, causal, block_len)


@pytest.mark.parametrize('same_document', [True, False])
def test_the_carried_shift_restarts_with_a_new_document_across_chunks(same_document):
  """Chunk A holds the near key (log-feature 0), chunk B the far one (-300). Same document:
  query B sees both (the near one dominates); a new document: only the far one."""
  k, v, q = keys_with_log_features([0.0, -300.0]), jnp.asarray(V2[None, :, None]), Q2
  positions, segments, valid = facts(2, [0, 0] if same_document else [0, 1])
  carry = performer.empty_state(1, 1, 1, 2)
  run = jax.jit(functools.partial(performer.causal_performer_attention, block_len=64))
  outs = []
  for part in (slice(0, 1), slice(1, 2)):
    out, carry = run(q[:, part], k[:, part], v[:, part], positions[:, part],
                     segments[:, part], valid[:, part], W1, carry)
    outs.append(out)
  want = expected(q, k, v, W1, positions, segments, valid, True)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(outs[1][0, 0, 0]), V2[0] if same_document else V2[1],
                             rtol=1e-6)


@pytest.mark.parametrize('block_len', [2, 4])
def test_no_limit_across_blocks(block_len):
  """Log-features [-300, -297 | 0, -2] (blocks of 2) or one block of 4 [-300, -297, 0, -2]
  split 2 | 2 into documents: every query equals the float64 reference."""
  logs = [-300.0, -297.0, 0.0, -2.0]
  k = keys_with_log_features(logs)
  v = jax.random.normal(jax.random.PRNGKey(0), (1, 4, 1, 2))
  q = jnp.zeros((1, 4, 1, 2))
  segments = [0, 0, 0, 0] if block_len == 2 else [0, 0, 1, 1]
  for causal in (True, False):
    out = attend(q, k, v, *facts(4, segments), W1, causal=causal, block_len=block_len)
    want = expected(q, k, v, W1, *facts(4, segments), causal)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)


def spread_keys():
  """Seven keys `[1, 7, 1, 2]`: far (log-features ~ -450 under W = 2 I, m = 2), middle
  (~ -110) and near (~ 0), in that order but the last; random queries and values."""
  radius = np.array([30.0, 29.8, 29.4, 15.0, 14.8, 0.3, 2.0])
  angle = np.array([0.3, 2.0, 4.0, 1.0, 5.0, 3.0, 2.5])
  x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], -1)   # x' = k / d^(1/4)
  k = jnp.asarray(x[None, :, None] * 2 ** 0.25, jnp.float32)
  q = jax.random.normal(jax.random.PRNGKey(1), (1, 7, 1, 2))
  v = jax.random.normal(jax.random.PRNGKey(2), (1, 7, 1, 2))
  return q, k, v, 2.0 * jnp.eye(2)


@pytest.mark.parametrize('segments', [[0] * 7, [0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
def test_causal_blocks_are_exact_at_any_spread_of_log_features(segments):
  """One block (block_len 7, 8, 64) or two (block_len 4) holding keys whose log-features
  spread over more than 440 nats, in one document or split in two: every query equals the
  float64 reference; gradients finite."""
  q, k, v, w = spread_keys()
  x = np.asarray(k, np.float64)[0, :, 0] * 2 ** -0.25
  logs = x @ np.asarray(w, np.float64).T - 0.5 * np.sum(x * x, -1, keepdims=True)
  assert (logs.max(0) - logs.min(0) > 440).all()
  for block_len in (4, 7, 8, 64):
    out = attend(q, k, v, *facts(7, segments), w, causal=True, block_len=block_len)
    want = expected(q, k, v, w, *facts(7, segments), True)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=2e-5,
                               err_msg=f'block_len {block_len}')
  assert_finite_gradients(q, k, v, *facts(7, segments), w, True, 64)


# -------------------------------------------------------------------- Routing


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('padded_slot', [0, 1])
def test_a_padded_token_of_a_real_cluster_is_neither_query_nor_key(causal, padded_slot):
  """n = 2, window 1, both tokens in cluster 0 of one document, one of them padding: the
  padded row is exactly 0 and the real token attends to itself alone."""
  v = jnp.asarray(V2[None, :, None], jnp.float32)
  q = k = jax.random.normal(jax.random.PRNGKey(0), (1, 2, 1, 2))
  valid = jnp.asarray([[padded_slot != 0, padded_slot != 1]])
  out = routing_refs.fast(q, k, v, jnp.zeros((1, 2, 1), jnp.int32),
                          jnp.arange(2, dtype=jnp.int32)[None], jnp.zeros((1, 2), jnp.int32),
                          valid, 1, causal)
  real = 1 - padded_slot
  np.testing.assert_array_equal(np.asarray(out[0, padded_slot, 0]), 0.0)
  np.testing.assert_allclose(np.asarray(out[0, real, 0]), V2[real], rtol=1e-6)


@pytest.mark.parametrize('causal,window', [(True, 2), (False, 3)])
def test_padding_inside_and_at_the_ends_of_rows(causal, window):
  """19 tokens, 3 clusters, padding at the start, inside and at the end of the rows with
  cluster ids, positions and documents of real tokens: padded rows exactly 0, real rows the
  float64 reference (whose mask never takes a padded key)."""
  n = 19
  q, k, v, clusters, positions, segments, _ = routing_refs.chunk(n, seed=47)
  valid = np.ones((routing_refs.B, n), bool)
  valid[0, [0, 5, 6, 11, 17, 18]] = False
  valid[1, [2, 9, 10, 15]] = False
  out = np.asarray(routing_refs.fast(q, k, v, clusters, positions, segments, valid, window,
                                     causal))
  mask = routing_refs.reference_mask(clusters, positions, segments, valid, window, causal)
  want = routing_refs.reference_attention(q, k, v, mask)
  np.testing.assert_array_equal(out[~valid], 0.0)
  np.testing.assert_allclose(out[valid], want[valid], rtol=1e-5, atol=1e-6)

"""Routing Transformer attention and its online k-means against independent references.

- `routing_attention` equals a float64 reference that decides every (query,
  key) pair by a Python loop from the rule in words: same cluster, same
  document, real key, not later (causal), not the query itself unless it has
  no other key, and at most `window` tokens of the cluster from the query
  (counted one token at a time); gradients against dense masked attention in
  JAX over the same mask. Causal and two-sided, documents, padding, windows
  shorter and longer than the clusters.
- With frozen centroids that make equal-sized clusters (window = n / k), the
  output equals dense attention under the same-cluster mask.
- The EMA update, assignment and commitment loss against numpy loops.
- No n x n array; config errors; the benchmark case equals its dense-mask case.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import routing_cases
from longformer_jax.attention.routing import attention as routing
from longformer_jax.attention.routing import online_kmeans
from longformer_jax.config.errors import ConfigError
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.routing_reference import (B, D, H, chunk, fast, jit, reference_attention,
                                             reference_mask)
from tests.support.tiny_models import tiny_config


def dense_jax_attention(q, k, v, mask):
  logits = jnp.where(mask, jnp.einsum('bqhd,bkhd->bhqk', q, k), -jnp.inf)
  weights = jax.nn.softmax(logits, axis=-1)
  weights = jnp.where(mask.any(-1, keepdims=True), weights, 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, v)


CASES = [(True, 2, 16), (True, 4, 13), (False, 2, 16),
         pytest.param(True, 32, 13, marks=pytest.mark.slow),
         pytest.param(False, 32, 13, marks=pytest.mark.slow)]


@pytest.mark.parametrize('causal,window,n', CASES)
def test_matches_pairwise_reference(causal, window, n):
  q, k, v, clusters, positions, segments, valid = chunk(n, seed=n + window)
  out = fast(q, k, v, clusters, positions, segments, valid, window, causal)
  mask = reference_mask(clusters, positions, segments, valid, window, causal)
  expected = reference_attention(q, k, v, mask)
  real = valid[:, :, None, None]
  np.testing.assert_allclose(np.asarray(out) * real, expected * real, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('causal', [True, False])
def test_gradients_match_dense_reference(causal):
  n, window = 13, 3
  q, k, v, clusters, positions, segments, valid = chunk(n, seed=5)
  mask = jnp.asarray(reference_mask(clusters, positions, segments, valid, window, causal))
  weights = jax.random.normal(jax.random.PRNGKey(9), (B, n, H, D)) * valid[:, :, None, None]
  facts = (clusters, positions, segments, valid)
  fast_loss = lambda q, k, v: jnp.sum(routing.routing_attention(  # noqa: E731
      q, k, v, *facts, window=window, causal=causal) * weights)
  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, mask) * weights)  # noqa
  got = jit(jax.grad(fast_loss, argnums=(0, 1, 2)))(q, k, v)
  want = jit(jax.grad(dense_loss, argnums=(0, 1, 2)))(q, k, v)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_equal_sized_clusters_from_frozen_centroids_are_dense_same_cluster_attention():
  """k orthogonal centroids; each token's routing vector near one of them, n / k per cluster;
  window n / k: every query sees all earlier keys of its cluster (dense same-cluster mask)."""
  n, k, d = 16, 4, D
  centroids = jnp.broadcast_to(jnp.eye(d)[:k], (H, k, d))
  rng = np.random.default_rng(0)
  owner = np.stack([np.stack([rng.permutation(np.repeat(np.arange(k), n // k))
                              for _ in range(H)], -1) for _ in range(B)])       # [B, n, H]
  z = 3.0 * np.eye(d)[owner] + 0.3 * rng.normal(size=(B, n, H, d))
  clusters = online_kmeans.nearest_centroid(online_kmeans.unit(z), centroids)
  np.testing.assert_array_equal(np.asarray(clusters), owner)
  positions = np.tile(np.arange(n, dtype=np.int32), (B, 1))
  segments, valid = np.zeros((B, n), np.int32), np.ones((B, n), bool)
  q, _, v, *_ = chunk(n, seed=3)
  out = fast(q, jnp.asarray(z, jnp.float32), v, clusters, positions, segments, valid,
             n // k, True)
  same = owner.transpose(0, 2, 1)[..., :, None] == owner.transpose(0, 2, 1)[..., None, :]
  earlier = np.arange(n)[None, :] < np.arange(n)[:, None]
  mask = same & earlier
  mask |= ~mask.any(-1, keepdims=True) & np.eye(n, dtype=bool)     # a cluster's first: itself
  np.testing.assert_allclose(np.asarray(out), reference_attention(q, z, v, mask),
                             rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ online k-means


def test_assignment_ema_update_and_commitment_loss_match_numpy_loops():
  n, k, d = 11, 3, D
  rng = np.random.default_rng(1)
  vectors = np.asarray(online_kmeans.unit(rng.normal(size=(B, n, H, d))), np.float64)
  centroids = np.asarray(online_kmeans.unit(rng.normal(size=(H, k, d))), np.float64)
  valid = np.ones((B, n), bool)
  valid[1, -3:] = False
  decay = 0.9
  clusters = np.asarray(online_kmeans.nearest_centroid(vectors, centroids))
  new = np.asarray(online_kmeans.ema_update(centroids, vectors, clusters, valid, decay))
  loss = float(online_kmeans.commitment_loss(jnp.asarray(vectors, jnp.float32), centroids,
                                             clusters, valid))
  expected_loss, count = 0.0, 0
  for head in range(H):
    for c in range(k):
      members = [vectors[r, t, head] for r in range(B) for t in range(n)
                 if valid[r, t] and np.argmax(centroids[head] @ vectors[r, t, head]) == c]
      if not members:
        np.testing.assert_allclose(new[head, c], centroids[head, c], rtol=1e-6)
        continue
      moved = decay * centroids[head, c] + (1 - decay) * np.mean(members, axis=0)
      np.testing.assert_allclose(new[head, c], moved / np.linalg.norm(moved), rtol=1e-5,
                                 atol=1e-6)
      expected_loss += sum(np.sum((m - centroids[head, c]) ** 2) for m in members)
      count += len(members)
  np.testing.assert_allclose(loss, expected_loss / count, rtol=1e-5)
  assert np.allclose(np.linalg.norm(new, axis=-1), 1.0, atol=1e-5)


def test_commitment_loss_gradient_reaches_vectors_not_centroids():
  rng = np.random.default_rng(2)
  vectors = jnp.asarray(rng.normal(size=(B, 5, H, D)), jnp.float32)
  centroids = jnp.asarray(online_kmeans.unit(rng.normal(size=(H, 3, D))))
  clusters = online_kmeans.nearest_centroid(online_kmeans.unit(vectors), centroids)
  valid = jnp.ones((B, 5), bool)
  g_vec, g_cen = jax.grad(lambda x, c: online_kmeans.commitment_loss(x, c, clusters, valid),
                          argnums=(0, 1))(vectors, centroids)
  assert np.abs(np.asarray(g_vec)).sum() > 0
  np.testing.assert_array_equal(np.asarray(g_cen), 0.0)


# ------------------------------------------------------------------ cost, config, benchmark


@pytest.mark.parametrize('causal', [True, False])
def test_forward_and_backward_never_build_an_n_by_n_array(causal):
  n, window = 1024, 32
  x = jnp.ones((1, n, 1, 8))
  clusters = jnp.zeros((1, n, 1), jnp.int32)
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  facts = (clusters, positions, jnp.zeros_like(positions), jnp.ones((1, n), bool))

  def loss(q, k, v):
    return jnp.sum(routing.routing_attention(q, k, v, *facts, window=window, causal=causal))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2)), x, x, x)
  assert largest <= n * 3 * window < n * n // 8, largest


@pytest.mark.parametrize('key,section,rule', [
    ('num_clusters', dict(num_clusters=0), '>= 1'),
    ('window', dict(window=0), '>= 1'),
    ('local_heads', dict(local_heads=-1), '>= 0'),
    ('local_heads', dict(local_heads=4), 'at least one routing head'),
    ('local_window', dict(local_window=0), '>= 1'),
    ('decay', dict(decay=1.0), '[0, 1)'),
    ('num_cluster', dict(num_cluster=4), 'did you mean num_clusters'),
])
def test_bad_settings_name_key_value_and_rule(key, section, rule):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='routing', num_heads=4, routing=section)
  assert error.value.key == f'model.routing.{key}'
  assert rule in str(error.value) and '\n' not in str(error.value)


def test_benchmark_fast_case_equals_its_dense_mask_case():
  cases = {case.variant: case for case in routing_cases.CASES}
  inputs = cases['routing_blocked'].make_inputs(256, jax.random.PRNGKey(0))
  fast_out = jit(cases['routing_blocked'].forward)(*inputs)
  dense_out = jit(cases['routing_dense_mask'].forward)(*inputs)
  np.testing.assert_allclose(np.asarray(fast_out), np.asarray(dense_out), rtol=1e-4, atol=2e-5)


def test_reversible_stack_is_refused_with_the_key():
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='routing', num_heads=4, stack='reversible')
  assert error.value.key == 'model.stack' and 'model state' in str(error.value)


def test_example_tasks_take_routing_and_a_task_that_cannot_carry_it_is_refused():
  from longformer_jax.experiment_config import resolve_config
  weights = {'commitment_loss': 0.1}
  resolved = resolve_config({'task': 'classification', 'model': {
      'attention': 'routing', 'num_classes': 2, 'aux_loss_weights': weights}})
  assert resolved['model']['attention'] == 'routing'
  with pytest.raises(ConfigError) as error:     # its report decodes with the parameters alone
    resolve_config({'task': 'seq2seq', 'model': {
        'attention': 'routing', 'decoder_layers': 1, 'aux_loss_weights': weights}})
  assert error.value.key == 'model.attention'
  assert "task 'seq2seq' does not carry" in str(error.value)
  assert "'lm', 'classification'" in str(error.value)
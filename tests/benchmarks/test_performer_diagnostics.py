"""benchmarks/performer_diagnostics.py's attention measurements against float64 loops.

- `kernel_weights` (a trained Performer's own attention) equals phi(q_i) . phi(k_j)
  normalised over the keys query i may see, phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)
  with x' = x / d^(1/4) (the paper's Lemma 1), summed pair by pair in Python
  over a mask built from the causal, document and padding rule.
- `log_normalisers` (the depth profile's carry share) equals log sum_m phi(q_i)_m z_m
  over the unshifted sums z of the keys of an earlier chunk, and of the
  chunk's own visible keys, both by the same loops, with the carry made by the
  library's causal scan.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import performer_diagnostics as diagnostics
from longformer_jax.attention.performer import kernel, random_features

B, N, H, D, M = 2, 7, 2, 8, 16


def features(seed: int = 0) -> np.ndarray:
  return np.asarray(random_features.random_feature_matrix(jax.random.PRNGKey(seed), M, D))


def log_phi(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """log(sqrt(m) phi(x)) of one `[d]` vector, float64."""
  scaled = np.asarray(x, np.float64) / D ** 0.25
  return np.asarray(w, np.float64) @ scaled - 0.5 * scaled @ scaled


def chunk(n: int = N, start: int = 0, boundary: int = 4) -> dict:
  """Row 0: one document; row 1: a document starting at slot `boundary`, its last slot padding."""
  segments = np.zeros((B, n), np.int32)
  segments[1, boundary:] = 1
  valid = np.ones((B, n), bool)
  valid[1, -1] = False
  return dict(positions=np.tile(np.arange(start, start + n, dtype=np.int32), (B, 1)),
              segment_ids=segments, input_mask=valid)


def sees(facts: dict, b: int, i: int, j: int) -> bool:
  return (j <= i and facts['segment_ids'][b, i] == facts['segment_ids'][b, j]
          and bool(facts['input_mask'][b, j]))


def test_kernel_weights_equal_a_loop_over_pairs():
  rng = np.random.default_rng(0)
  q, k = (rng.normal(size=(B, N, H, D)).astype(np.float32) * 1.5 for _ in range(2))
  w, facts = features(), chunk()
  got = diagnostics.kernel_weights(jnp.asarray(q), jnp.asarray(k), jnp.asarray(w),
                                   diagnostics.causal_mask(facts))
  for b in range(B):
    for h in range(H):
      for i in range(N):
        pairs = [math.fsum(np.exp(log_phi(q[b, i, h], w) + log_phi(k[b, j, h], w)) / M)
                 if sees(facts, b, i, j) else 0.0 for j in range(N)]
        np.testing.assert_allclose(got[b, h, i], np.asarray(pairs) / sum(pairs), rtol=1e-5,
                                   atol=1e-9)


def test_log_normalisers_equal_sums_over_earlier_and_own_keys():
  rng = np.random.default_rng(1)
  q1, k1, v1, q2, k2 = (rng.normal(size=(B, N, H, D)).astype(np.float32) for _ in range(5))
  w = features(1)
  first, second = chunk(), chunk(start=N, boundary=N)      # row 1's document goes on
  second['segment_ids'][:] = first['segment_ids'][:, -1:]
  second['input_mask'][:] = True
  state = kernel.empty_state(B, H, M, D)
  _, state = kernel.causal_performer_attention(
      jnp.asarray(q1), jnp.asarray(k1), jnp.asarray(v1), jnp.asarray(first['positions']),
      jnp.asarray(first['segment_ids']), jnp.asarray(first['input_mask']), jnp.asarray(w),
      state, block_len=4)
  log_carry, log_chunk = diagnostics.log_normalisers(
      jnp.asarray(q2), jnp.asarray(k2), jnp.asarray(w), diagnostics.causal_mask(second), state)
  for b in range(B):
    # The carry holds the keys of the first chunk's last document (row 1: slots 4, 5; 6 is
    # padding).
    earlier = [j for j in range(N) if first['input_mask'][b, j]
               and first['segment_ids'][b, j] == first['segment_ids'][b, -1]]
    for h in range(H):
      z = [math.fsum(np.exp(log_phi(k1[b, j, h], w)[f]) for j in earlier) for f in range(M)]
      for i in range(N):
        a = np.exp(log_phi(q2[b, i, h], w))
        np.testing.assert_allclose(log_carry[b, i, h], math.log(math.fsum(a * z)), rtol=1e-5,
                                   atol=2e-5)
        own = math.fsum(math.fsum(a * np.exp(log_phi(k2[b, j, h], w)))
                        for j in range(N) if sees(second, b, i, j))
        np.testing.assert_allclose(log_chunk[b, i, h], math.log(own), rtol=1e-5, atol=2e-5)

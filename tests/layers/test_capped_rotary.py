"""Distance-capped RoPE (LM-Infinite / Attendre) against a python loop in float64.

The reference builds, for every (query, key) pair, the rotation matrix of
angle min(p_i - p_j, L) * theta_f per frequency pair and applies it to the
key, exactly as the formula q_i^T R(min(p_i - p_j, L)) k_j reads.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.layers.capped_rotary import capped_rotary_scores
from longformer_jax.layers.positional import apply_rotary

B, Q, K, H, HD = 2, 5, 9, 2, 8


def reference_scores(q, k, q_pos, k_pos, cap, bidirectional):
  """Loop over pairs: s = sum_f [q_a, q_b] . Rot(angle_f) [k_a, k_b]; float64."""
  half = HD // 2
  freqs = 1.0 / (10000.0 ** (np.arange(half) / half))
  out = np.zeros((B, H, Q, K))
  for b in range(B):
    for i in range(Q):
      for j in range(K):
        distance = q_pos[b, i] - k_pos[b, j]
        if cap >= 0:
          distance = min(distance, cap)
          if bidirectional:
            distance = max(distance, -cap)
        for h in range(H):
          total = 0.0
          for f in range(half):
            # q^T R(p_i)^T R(p_j) k = q^T R(-(p_i - p_j)) k: rotate k by -distance.
            angle = -distance * freqs[f]
            ka, kb = k[b, j, h, f], k[b, j, h, f + half]
            rotated_a = ka * np.cos(angle) - kb * np.sin(angle)
            rotated_b = kb * np.cos(angle) + ka * np.sin(angle)
            total += q[b, i, h, f] * rotated_a + q[b, i, h, f + half] * rotated_b
          out[b, h, i, j] = total
  return out


def random_case(seed):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, Q, H, HD)).astype(np.float32)
  k = rng.normal(size=(B, K, H, HD)).astype(np.float32)
  q_pos = np.sort(rng.integers(0, 40, (B, Q)), axis=1).astype(np.int32)
  k_pos = rng.integers(0, 40, (B, K)).astype(np.int32)   # any order: past and future keys
  return q, k, q_pos, k_pos


@pytest.mark.parametrize('cap', [0, 3, 11])
@pytest.mark.parametrize('bidirectional', [False, True])
def test_capped_scores_match_python_loop(cap, bidirectional):
  q, k, q_pos, k_pos = random_case(cap)
  got = capped_rotary_scores(jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos),
                             jnp.asarray(k_pos), cap, bidirectional=bidirectional)
  expected = reference_scores(q.astype(np.float64), k.astype(np.float64), q_pos, k_pos, cap,
                              bidirectional)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_cap_beyond_every_distance_is_plain_rope():
  q, k, q_pos, k_pos = random_case(7)
  plain = jnp.einsum('bqhd,bkhd->bhqk', apply_rotary(jnp.asarray(q), jnp.asarray(q_pos)),
                     apply_rotary(jnp.asarray(k), jnp.asarray(k_pos)))
  for cap in (40, 1000):
    got = capped_rotary_scores(jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos),
                               jnp.asarray(k_pos), cap, bidirectional=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(plain), rtol=1e-4, atol=1e-4)
  disabled = capped_rotary_scores(jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos),
                                  jnp.asarray(k_pos), -1)
  np.testing.assert_allclose(np.asarray(disabled), np.asarray(plain), rtol=1e-4, atol=1e-4)


def test_far_keys_see_one_angle():
  """Every key farther than L scores as if it sat exactly L behind the query."""
  q, k, _, _ = random_case(3)
  q_pos = np.full((B, Q), 100, np.int32)
  k_pos = np.tile(np.arange(K, dtype=np.int32) * 7, (B, 1))      # distances 100 .. 44
  same_k = np.broadcast_to(k[:, :1], k.shape).copy()               # one key at every position
  got = np.asarray(capped_rotary_scores(jnp.asarray(q), jnp.asarray(same_k), jnp.asarray(q_pos),
                                        jnp.asarray(k_pos), 5))
  np.testing.assert_allclose(got, np.broadcast_to(got[..., :1], got.shape), rtol=1e-5, atol=1e-5)

"""RoPE with the relative distance capped (LM-Infinite; Han et al., 2023).

LM-Infinite caps the relative distance seen by rotary attention at the
pre-training length L, so that a model trained on contexts of L tokens never
sees an unseen rotation angle. Attendre (Yang & Hua et al., 2024) uses the
cap without LM-Infinite's Lambda-shaped mask: every key stays visible, and
the score of query i with key j is

  s_ij = q_i^T R(min(p_i - p_j, L)) k_j        (Su et al., 2021, eq. 16)

where R(theta) is the block rotation of RoPE by theta times each frequency.

This is exact, not an approximation of positions: RoPE's score depends only
on the difference of the two rotation positions, so
- near keys (p_i - p_j <= L): rotate q at p_i and k at p_j (plain RoPE);
- far keys (p_i - p_j > L): rotate q at L and leave k unrotated (position 0),
  which gives the angle L - 0 = L whatever p_j is.
Both score matrices are computed and one is picked per (query, key) pair
from the positions. With `bidirectional=True`, keys more than L in the
future get the angle -L the same way (q rotated at -L).
"""

import jax
import jax.numpy as jnp

from longformer_jax.layers.positional import apply_rotary


def rotary_scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """`q [b, q, h, d]`, `k [b, k, h, d]` -> `[b, h, q, k]` dot products (unscaled)."""
  return jnp.einsum('bqhd,bkhd->bhqk', q, k)


def constant_rotation(q: jax.Array, angle_position: int, inv_freq=None,
                      attention_factor: float = 1.0) -> jax.Array:
  """`q [b, q, h, d]` rotated at the same position `angle_position` for every token."""
  positions = jnp.full(q.shape[:2], angle_position, jnp.int32)
  return apply_rotary(q, positions, inv_freq=inv_freq, attention_factor=attention_factor)


def capped_rotary_scores(q: jax.Array, k: jax.Array, q_positions: jax.Array,
                         k_positions: jax.Array, max_distance: int,
                         bidirectional: bool = False, inv_freq=None,
                         attention_factor: float = 1.0) -> jax.Array:
  """Rotary dot products with the relative distance capped at `max_distance`.

  Args:
    q: `[batch, q, heads, head_dim]` queries, NOT rotated.
    k: `[batch, k, heads, head_dim]` keys, NOT rotated.
    q_positions: `[batch, q]` int32 absolute positions.
    k_positions: `[batch, k]` int32 absolute positions.
    max_distance: L >= 0; distances above L are scored as L. A negative
      value disables the cap (plain RoPE).
    bidirectional: also cap distances below -L at -L (keys in the future).
    inv_freq: optional `[head_dim / 2]` (or per-row `[batch, head_dim / 2]`) rotary
      frequencies (`rotary_inv_freq`: another base, or a scaling of imported
      checkpoints); None: RoPE's default.
    attention_factor: the factor on cos and sin of YaRN and LongRoPE, so on q and on k
      (a far key, left unrotated, is multiplied by it).
  Returns:
    `[batch, heads, q, k]` unscaled scores q_i^T R(min(p_i - p_j, L)) k_j
    (in the dtype of `q`).
  """
  # Rotate relative to the chunk's first query: scores depend only on the
  # difference, and small angles keep float32 exact on long streams.
  origin = q_positions[:, :1]
  near = rotary_scores(
      apply_rotary(q, q_positions - origin, inv_freq=inv_freq, attention_factor=attention_factor),
      apply_rotary(k, k_positions - origin, inv_freq=inv_freq, attention_factor=attention_factor))
  if max_distance < 0:
    return near
  distance = (q_positions[:, :, None] - k_positions[:, None, :])[:, None]  # [b, 1, q, k]
  if attention_factor != 1.0:
    k = k * jnp.asarray(attention_factor, k.dtype)
  far_past = rotary_scores(constant_rotation(q, max_distance, inv_freq, attention_factor), k)
  scores = jnp.where(distance > max_distance, far_past, near)
  if bidirectional:
    far_future = rotary_scores(constant_rotation(q, -max_distance, inv_freq, attention_factor), k)
    scores = jnp.where(distance < -max_distance, far_future, scores)
  return scores

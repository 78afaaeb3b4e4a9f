"""Positional signals: sinusoids (Vaswani et al., 2017) and rotary (Su et al., 2021)."""

import jax
import jax.numpy as jnp


def sinusoid_embedding(distances: jax.Array, dim: int) -> jax.Array:
  """Transformer-XL's R: `[...]` distances -> float32 `[..., dim]`.

  Layout [sin(d * f_0..f_{dim/2-1}), cos(...)], f_i = 10000^(-2i/dim), as in
  the reference implementation of Dai et al. (2019).
  """
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  angles = distances.astype(jnp.float32)[..., None] * inv_freq
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def apply_rotary(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotates pairs of features by position-dependent angles (RoPE).

  Args:
    x: `[batch, length, heads, head_dim]`, head_dim even.
    positions: `[batch, length]` absolute positions.
  Returns:
    `x` rotated, same shape and dtype. q·k then depends only on the position
    difference (Su et al., 2021, eq. 16), so caching hidden states and rotating
    them at their stored positions is exact.
  """
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) / half))
  angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # [b, l, 1, half]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


def relative_shift(scores: jax.Array) -> jax.Array:
  """Transformer-XL's efficient relative shift (Dai et al., 2019, appendix B).

  Args:
    scores: `[batch, heads, q, k]` where column r holds the score for relative
      distance `k - 1 - r` (R laid out from the farthest distance to 0).
  Returns:
    `[batch, heads, q, k]` with `out[i, j] = scores[i, j + q - 1 - i]`: the
    score for distance `(k - q) + i - j` when the q queries are the last q
    of the k keys. Entries with j > (k - q) + i (future keys) are garbage and
    must be masked by the caller.
  """
  b, h, q, k = scores.shape
  padded = jnp.pad(scores, ((0, 0), (0, 0), (0, 0), (1, 0)))  # [b, h, q, k + 1]
  padded = padded.reshape(b, h, k + 1, q)[:, :, 1:]             # drop q entries
  return padded.reshape(b, h, q, k)

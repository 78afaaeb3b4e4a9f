"""Positional signals: sinusoids (Vaswani et al., 2017) and rotary (Su et al., 2021).

Rotary frequencies (`rotary_inv_freq`) follow the shared settings
`model.rope_theta` (the base, 10000 by default) and `model.rope_scaling`, the
context-extension variants of released Llama checkpoints:

  {}                                  no scaling
  {type: linear, factor: f}           position interpolation (Chen et al., 2023):
                                      every frequency divided by f
  {type: llama3, factor: f, low_freq_factor: l, high_freq_factor: h,
   original_max_position_embeddings: n}
                                      Llama 3.1: wavelengths longer than n / l are
                                      divided by f, shorter than n / h kept, and
                                      those between interpolated smoothly
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

ROPE_SCALING_TYPES = ('linear', 'llama3')
LLAMA3_KEYS = ('factor', 'low_freq_factor', 'high_freq_factor',
               'original_max_position_embeddings')


def sinusoid_embedding(distances: jax.Array, dim: int) -> jax.Array:
  """Transformer-XL's R: `[...]` distances -> float32 `[..., dim]`.

  Layout [sin(d * f_0..f_{dim/2-1}), cos(...)], f_i = 10000^(-2i/dim), as in
  the reference implementation of Dai et al. (2019).
  """
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  angles = distances.astype(jnp.float32)[..., None] * inv_freq
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def rope_scaling_error(scaling) -> str:
  """What is wrong with a `model.rope_scaling` mapping ('' when it is valid)."""
  if not scaling:
    return ''
  kind = scaling.get('type')
  if kind not in ROPE_SCALING_TYPES:
    return f'type {kind!r} is not supported; choose one of {ROPE_SCALING_TYPES} (or {{}})'
  needed = ('factor',) if kind == 'linear' else LLAMA3_KEYS
  allowed = ('type',) + needed
  for key in scaling:
    if key not in allowed:
      return f'unknown key {key!r} for type {kind!r}; expected {allowed}'
  for key in needed:
    value = scaling.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
      return f'{key} must be a positive number (got {value!r})'
  if kind == 'llama3' and not scaling['high_freq_factor'] > scaling['low_freq_factor']:
    return 'high_freq_factor must be greater than low_freq_factor'
  return ''


def rotary_inv_freq(head_dim: int, theta: float = 10000.0, scaling=None) -> np.ndarray:
  """float32 `[head_dim / 2]`: the rotation frequencies f_i = theta^(-2i/head_dim), scaled.

  `scaling`: a `model.rope_scaling` mapping (module docstring); empty: none.
  """
  half = head_dim // 2
  inv_freq = 1.0 / (np.float32(theta) ** (np.arange(half, dtype=np.float32) / np.float32(half)))
  scaling = dict(scaling or {})
  kind = scaling.get('type')
  if kind == 'linear':
    inv_freq = inv_freq / np.float32(scaling['factor'])
  elif kind == 'llama3':
    factor = float(scaling['factor'])
    low, high = float(scaling['low_freq_factor']), float(scaling['high_freq_factor'])
    context = float(scaling['original_max_position_embeddings'])
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def apply_rotary(x: jax.Array, positions: jax.Array, base: float = 10000.0,
                 inv_freq=None) -> jax.Array:
  """Rotates pairs of features by position-dependent angles (RoPE).

  The pairs are (i, i + head_dim/2), the half-split layout of GPT-NeoX and
  Hugging Face's `rotate_half`.

  Args:
    x: `[batch, length, heads, head_dim]`, head_dim even.
    positions: `[batch, length]` absolute positions.
    base: theta of f_i = theta^(-2i/head_dim) when `inv_freq` is None.
    inv_freq: optional `[head_dim / 2]` frequencies (`rotary_inv_freq`).
  Returns:
    `x` rotated, same shape and dtype. q·k then depends only on the position
    difference (Su et al., 2021, eq. 16), so caching hidden states and rotating
    them at their stored positions is exact.
  """
  half = x.shape[-1] // 2
  if inv_freq is None:
    inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) / half))
  else:
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
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

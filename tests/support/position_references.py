"""Positional encodings written out in numpy: RoPE position by position, and the sinusoid table."""

import numpy as np


def numpy_rotate(x, positions):
  """RoPE written directly from Su et al. (2021), eq. 34, pairs (i, i + HD/2)."""
  half = x.shape[-1] // 2
  freqs = 1.0 / (10000.0 ** (np.arange(half) / half))
  out = np.empty_like(x)
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      angle = positions[b, t] * freqs
      a, c = x[b, t, :, :half], x[b, t, :, half:]
      out[b, t, :, :half] = a * np.cos(angle) - c * np.sin(angle)
      out[b, t, :, half:] = c * np.cos(angle) + a * np.sin(angle)
  return out


def numpy_sinusoid(distance: float, dim: int) -> np.ndarray:
  inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2) / dim))
  return np.concatenate([np.sin(distance * inv_freq), np.cos(distance * inv_freq)])

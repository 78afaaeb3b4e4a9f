"""Dilated sliding windows (Beltagy et al., 2020, section 3.1) at O(n·w) cost.

With dilation d a query attends to the keys at distances 0, d, 2d, ..., w·d
(and the negatives when two-sided): keys whose slot has the query's residue
modulo d. Splitting the sequence into its d residue classes turns this into
d ordinary (undilated) sliding windows of `window` slots over sequences d
times shorter, folded into the batch axis. The work stays n·w per head
whatever d, and the receptive field of l layers is l·d·w.

The position rule (`sliding_window.window_allowed` with the dilation)
still decides what is attended, so the result equals the dense-mask
computation whenever slot distance equals position distance (a chunk and its
FIFO cache of a continuous stream).
"""

import jax
import jax.numpy as jnp

from longformer_jax.attention.core.sliding_window import blocked_window_attention


def _pad_sequence(x: jax.Array, front: int, back: int, value=0) -> jax.Array:
  widths = [(0, 0)] * x.ndim
  widths[1] = (front, back)
  return jnp.pad(x, widths, constant_values=value)


def split_residues(x: jax.Array, dilation: int) -> jax.Array:
  """`[b, L, ...]` (L a multiple of d) -> `[b * d, L / d, ...]`; row b*d + r holds slots r, r+d, ..."""
  b, length = x.shape[:2]
  x = x.reshape(b, length // dilation, dilation, *x.shape[2:])
  return jnp.swapaxes(x, 1, 2).reshape(b * dilation, length // dilation, *x.shape[3:])


def merge_residues(x: jax.Array, dilation: int) -> jax.Array:
  """The inverse of `split_residues`."""
  bd, length = x.shape[:2]
  x = x.reshape(bd // dilation, dilation, length, *x.shape[2:])
  return jnp.swapaxes(x, 1, 2).reshape(bd // dilation, length * dilation, *x.shape[3:])


def dilated_window_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                             q_positions: jax.Array, q_segments: jax.Array,
                             k_positions: jax.Array, k_segments: jax.Array, k_valid: jax.Array,
                             *, window: int, dilation: int, block_size: int, causal: bool = True,
                             key_offset: int = 0, scale: float = 1.0
                             ) -> tuple[jax.Array, jax.Array]:
  """Sliding window of `window` keys on each allowed side, every `dilation`-th position.

  Shapes as `blocked_window_attention`: q `[b, lq, h, d]` with query i at key
  slot `key_offset + i` of k, v `[b, lk, h, d]`. Returns `(out [b, lq, h, d],
  lse [b, lq, h])`.
  """
  if dilation == 1:
    return blocked_window_attention(q, k, v, q_positions, q_segments, k_positions, k_segments,
                                    k_valid, window=window, block_size=block_size,
                                    causal=causal, key_offset=key_offset, scale=scale)
  lq, lk = q.shape[1], k.shape[1]
  # Pad the front of the keys so that query i sits at a slot with residue i % d,
  # and both ends to multiples of d.
  front = (-key_offset) % dilation
  q_back = (-lq) % dilation
  k_back = (-(front + lk)) % dilation
  pad_q = lambda x: split_residues(_pad_sequence(x, 0, q_back), dilation)
  pad_k = lambda x, value=0: split_residues(_pad_sequence(x, front, k_back, value), dilation)
  out, lse = blocked_window_attention(
      pad_q(q), pad_k(k), pad_k(v), pad_q(q_positions), pad_q(q_segments),
      pad_k(k_positions), pad_k(k_segments), pad_k(k_valid, False),
      window=window, block_size=block_size, causal=causal, dilation=dilation,
      key_offset=(front + key_offset) // dilation, scale=scale)
  return merge_residues(out, dilation)[:, :lq], merge_residues(lse, dilation)[:, :lq]

"""Longformer's sliding-window attention with the chunk split over the `sequence` axis.

A query sees at most `window` keys on each side (one-sided `window`, the
convention of `attention/core/sliding_window.py`), so a device needs only
a halo from its neighbours, never the whole chunk: the last `window` tokens
of device i - 1 (and, bidirectional, the first `window` of device i + 1),
keys, values, positions, document ids and valid bits, one
`jax.lax.ppermute` hop each. The ends of the chunk receive nothing (their
halo is invalid, hence masked). Each device then runs the blocked window
kernel (`sliding_window.blocked_window_attention`) over
`[left halo; own tokens; right halo]` with its queries at key slot
`window`. Communication is `2 * window` tokens per device, independent of
the chunk length; memory is O(chunk / n).

The layout is contiguous (device i holds tokens `[i c/n, (i+1) c/n)`): the
work of a window is the same on every device, so the zigzag layout is not
needed, and the kernel picks key candidates by slot, which requires slot
distance to equal position distance. Longformer's global tokens add a part to
this window (`global_attention.py`).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from longformer_jax.attention.core.sliding_window import auto_block_size, blocked_window_attention
from longformer_jax.parallel.mesh import SEQUENCE_AXIS


def _halos(arrays: tuple, window: int, axis_name: str, axis_size: int,
           causal: bool) -> tuple[tuple, tuple]:
  """`(left, right)`: each of `arrays` (`[b, c_local, ...]`) from the neighbouring devices.

  `left` holds the last `window` tokens of device i - 1 (zeros on device 0),
  `right` the first `window` of device i + 1 (zeros on the last device;
  empty when causal).
  """
  to_next = [(j, j + 1) for j in range(axis_size - 1)]
  to_previous = [(j + 1, j) for j in range(axis_size - 1)]
  left = tuple(jax.lax.ppermute(a[:, -window:], axis_name, to_next) for a in arrays)
  if causal:
    right = tuple(a[:, :0] for a in arrays)
  else:
    right = tuple(jax.lax.ppermute(a[:, :window], axis_name, to_previous) for a in arrays)
  return left, right


def window_attention_local(q, k, v, positions, segment_ids, valid, *, window: int,
                           axis_name: str, axis_size: int, causal: bool, scale: float,
                           block_size: int, return_lse: bool = False):
  """One device's part of sequence-parallel sliding-window attention (inside `shard_map`).

  Args:
    q, k, v: `[b, c_local, h, d]`; positions, segment_ids, valid: `[b, c_local]`.
    return_lse: also return the float32 log-sum-exp `[b, c_local, h]`, to merge
      the window with another part (global keys: global_attention.py).
  Returns:
    `[b, c_local, h, d]` in `v`'s dtype (and the lse with `return_lse`).
  """
  left, right = _halos((k, v, positions, segment_ids, valid), window, axis_name, axis_size,
                       causal)
  keys = [jnp.concatenate([l, a, r], axis=1)
          for l, a, r in zip(left, (k, v, positions, segment_ids, valid), right)]
  k_all, v_all, k_pos, k_seg, k_valid = keys
  out, lse = blocked_window_attention(q, k_all, v_all, positions, segment_ids, k_pos, k_seg,
                                      k_valid, window=window, block_size=block_size,
                                      causal=causal, key_offset=window, scale=scale)
  return (out, lse) if return_lse else out


def split_settings(q: jax.Array, mesh, window: int, scale, block_size) -> tuple:
  """`(n, scale, block_size)` of a window split over the `sequence` axis of `mesh`; the
  window must fit in one device's share of the chunk (`q [batch, chunk, heads, head_dim]`)."""
  n = mesh.shape[SEQUENCE_AXIS]
  local_length = q.shape[1] // n
  if not 1 <= window <= local_length:
    raise ValueError(f'window {window} must be in [1, chunk / sequence axis = {local_length}]')
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  return n, scale, min(block_size or auto_block_size(window), local_length)


def sequence_parallel_window_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                       positions: jax.Array, segment_ids: jax.Array,
                                       valid: jax.Array, *, mesh: jax.sharding.Mesh,
                                       window: int, causal: bool = True,
                                       scale: Optional[float] = None,
                                       block_size: Optional[int] = None,
                                       batch_axes: tuple = ('data', 'fsdp'),
                                       head_axis: Optional[str] = 'tensor') -> jax.Array:
  """Sliding-window attention of a chunk split along its length over `mesh`'s `sequence` axis.

  Equal to the dense masked softmax with the mask `causal_document_mask &
  window_allowed(window)` (tests/attention/test_sequence_parallel.py).

  Args:
    q, k, v: `[batch, chunk, heads, head_dim]`, natural (contiguous) order.
    positions, segment_ids, valid: `[batch, chunk]`; positions consecutive
      along the chunk (a stream's chunk).
    window: one-sided reach, at most `chunk / n` (one neighbour's halo).
    scale: logit scale, default `1 / sqrt(head_dim)`.
    block_size: queries per block of the window kernel (default from `window`).
  Returns:
    `[batch, chunk, heads, head_dim]` in `v`'s dtype.
  """
  n, scale, block_size = split_settings(q, mesh, window, scale, block_size)
  heads = PartitionSpec(batch_axes, SEQUENCE_AXIS, head_axis, None)
  tokens = PartitionSpec(batch_axes, SEQUENCE_AXIS)
  local = functools.partial(window_attention_local, window=window, axis_name=SEQUENCE_AXIS,
                            axis_size=n, causal=causal, scale=scale, block_size=block_size)
  return jax.shard_map(local, mesh=mesh, in_specs=(heads,) * 3 + (tokens,) * 3,
                       out_specs=heads, check_vma=False)(q, k, v, positions, segment_ids, valid)

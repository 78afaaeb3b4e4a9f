"""Transformer-XL's relative-position attention with the chunk split over the `sequence` axis.

The score of query i and key j (Dai et al., 2019, section 3.3, the
decomposition of A^rel_ij) is

  A_ij = (q_i + u)^T k_j + (q_i + v)^T W_kR R_{i-j}

scaled by 1/sqrt(head_dim). Keys are `[memory; chunk]` as in the cache path of
`attention.py`: the memory is whole on every device, the
chunk is split (ring or all-gather, zigzag load balancing) and the parts are
merged exactly with their log-sum-exps (`merge_parts`). The content term is
the ordinary dot product of the queries q + u with the keys. The position
term is that module's `logit_bias`: each device builds once the table
`(q_i + v)^T W_kR R_d` of its own queries for every distance d = 0..D-1
(`[b, h, c_local, D]`, the 'gather' formulation of `attention/xl.py`), and
each part (memory, every key block) looks its pairs' distances up in it from
the absolute positions of the local queries and of the part's keys: distance
i - j clipped to `[0, D - 1]`, D = `mem + chunk` or `clamp_len + 1` (negative,
i.e. future, distances are masked anyway). Nothing depends on slots, so the
result is the same in any token layout (tests/attention/test_sequence_parallel_xl.py).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from longformer_jax.attention.sequence_parallel import load_balance as zigzag
from longformer_jax.parallel.mesh import SEQUENCE_AXIS
from longformer_jax.attention.sequence_parallel.attention import (METHODS,
                                                          all_gather_attention_local,
                                                          ring_attention_local)


def position_term(q_positions: jax.Array, k_positions: jax.Array, table: jax.Array, *,
                  scale: float) -> jax.Array:
  """The scaled (q_i + v)^T W_kR R_{i-j} of every pair, read from a per-device table.

  Args:
    q_positions: `[b, q]` the local queries' absolute positions.
    k_positions: `[b, k]` one part's keys' absolute positions.
    table: `[b, h, q, D]`, `(q_i + v)^T W_kR R_d` for d = 0..D-1 (larger distances
      share R_{D-1}: `clamp_len`, or none visible in a continuous stream).
  Returns:
    `[b, h, q, k]` float32, to add to the scaled content logits.
  """
  distances = jnp.clip(q_positions[:, :, None] - k_positions[:, None, :], 0, table.shape[-1] - 1)
  picked = jnp.take_along_axis(table, distances[:, None], axis=-1)
  return picked.astype(jnp.float32) * jnp.asarray(scale, jnp.float32)


def _relative_local(q_content, q_position, k, v, positions, segment_ids, valid, relative_keys,
                    *memory, method: str, axis_size: int, scale: float) -> jax.Array:
  """One device's part (inside `shard_map`): `[b, c_local, h, d]`."""
  table = jnp.einsum('bqhd,khd->bhqk', q_position, relative_keys)      # [b, h, c_local, D]
  bias = dict(logit_bias=functools.partial(position_term, scale=scale), bias_args=(table,))
  if method == 'ring':
    return ring_attention_local(q_content, k, v, positions, segment_ids, valid, *memory,
                                axis_name=SEQUENCE_AXIS, axis_size=axis_size, causal=True,
                                scale=scale, **bias)
  return all_gather_attention_local(q_content, k, v, positions, segment_ids, valid, *memory,
                                    axis_name=SEQUENCE_AXIS, causal=True, scale=scale, **bias)


def sequence_parallel_relative_attention(
    q_content: jax.Array, q_position: jax.Array, k: jax.Array, v: jax.Array,
    relative_keys: jax.Array, positions: jax.Array, segment_ids: jax.Array, valid: jax.Array,
    *, mesh: jax.sharding.Mesh, method: str = 'ring', load_balance: bool = False,
    scale: Optional[float] = None, memory: Optional[tuple] = None,
    batch_axes: tuple = ('data', 'fsdp'), head_axis: Optional[str] = 'tensor') -> jax.Array:
  """Causal Transformer-XL attention of a chunk split along its length over `mesh`'s `sequence` axis.

  Equal to the dense softmax of `(q_content k^T + T[i, clip(i - j)]) * scale` over the keys
  `[memory; chunk]` under `causal_document_mask`, T the table of `position_term`.

  Args:
    q_content, q_position: `[batch, chunk, heads, head_dim]`, the queries plus the
      content bias u and plus the position bias v, in natural token order.
    k, v: `[batch, chunk, heads, head_dim]` the chunk's keys and values.
    relative_keys: `[D, heads, head_dim]`, W_kR R_d for d = 0..D-1 (clamped already).
    positions, segment_ids: `[batch, chunk]` int; valid: `[batch, chunk]` bool.
    mesh: with a `sequence` axis dividing `chunk` (2x it with load balancing).
    method: 'all_gather' or 'ring'; load_balance: zigzag layout in and out.
    scale: logit scale, default `1 / sqrt(head_dim)`.
    memory: optional `(k_mem, v_mem [batch, m, heads, head_dim], positions_mem,
      segments_mem, valid_mem [batch, m])`, replicated along `sequence`.
    batch_axes, head_axis: the mesh axes that shard `batch` and `heads`.
  Returns:
    `[batch, chunk, heads, head_dim]` in `q_content`'s dtype and natural order.
  """
  if method not in METHODS:
    raise ValueError(f'method {method!r} is not one of {METHODS}')
  n = mesh.shape[SEQUENCE_AXIS]
  scale = q_content.shape[-1] ** -0.5 if scale is None else scale
  arrays = (q_content, q_position, k, v, positions, segment_ids, valid)
  if load_balance:
    arrays = tuple(zigzag.to_zigzag(a, n, axis=1) for a in arrays)
  heads = PartitionSpec(batch_axes, SEQUENCE_AXIS, head_axis, None)
  tokens = PartitionSpec(batch_axes, SEQUENCE_AXIS)
  arrays += (relative_keys,)
  in_specs = (heads,) * 4 + (tokens,) * 3 + (PartitionSpec(None, head_axis, None),)
  if memory is not None:   # the memory is whole on every device of the sequence axis
    arrays += tuple(memory)
    in_specs += (PartitionSpec(batch_axes, None, head_axis, None),) * 2 + (
        PartitionSpec(batch_axes, None),) * 3
  local = functools.partial(_relative_local, method=method, axis_size=n, scale=scale)
  out = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=heads,
                      check_vma=False)(*arrays)
  out = out.astype(q_content.dtype)
  return zigzag.from_zigzag(out, n, axis=1) if load_balance else out

"""Longformer's window + global attention with the chunk split over the `sequence` axis.

The single-device layer (attention/longformer/attention.py, attention/core/global_tokens.py)
picks the first g flagged valid tokens of the chunk (`slots [batch, g]`) and
computes, in one softmax per query:

  * every query over its sliding window (global keys removed from it) and
    over the g global keys (local K_s, V_s), two parts merged exactly;
  * each global token's own row over ALL keys of the chunk, with the global
    projections Q_g, K_g, V_g (or the local ones), written over its slot.

With the chunk split contiguously over n devices (device i holds slots
`[i c/n, (i+1) c/n)`):

  * the window part is the halo exchange of
    `window_attention.window_attention_local`;
  * the g global keys, values, positions and document ids are gathered onto
    every device: each device contributes the global slots it holds and zeros
    elsewhere, and a `psum` adds them (exact: one non-zero term per slot);
  * a global row is a softmax over keys spread over every device: each device
    computes the part over its own keys (normalised output and log-sum-exp),
    the n parts (`[n, batch, g, heads, head_dim]`, small) are all-gathered and
    merged with `partial_softmax.merge_parts`; the device holding a global
    token's slot writes its row.

Communication per device: `2 * window` halo tokens, g gathered tokens and n x g
partial rows, independent of the chunk length.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from longformer_jax.attention.core import global_tokens
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.core.partial_softmax import merge_parts, softmax_part
from longformer_jax.parallel.mesh import SEQUENCE_AXIS
from longformer_jax.attention.sequence_parallel.window_attention import (split_settings,
                                                                 window_attention_local)


def _local_slots(slots: jax.Array, local_length: int, axis_name: str):
  """Chunk slots `[b, g]` -> `(slots on this device [b, g], held [b, g] bool)`.

  Slots held by another device (or unused) become `local_length`, out of
  range, which `global_tokens.scatter_slots` drops.
  """
  local = slots - jax.lax.axis_index(axis_name) * local_length
  held = (local >= 0) & (local < local_length)
  return jnp.where(held, local, local_length), held


def _gather_global(x: jax.Array, local_slots: jax.Array, held: jax.Array,
                   axis_name: str) -> jax.Array:
  """`x [b, c_local, ...]` at the chunk's global slots -> `[b, g, ...]` on every device."""
  rows = global_tokens.gather_slots(x, local_slots)
  held = held.reshape(held.shape + (1,) * (x.ndim - 2))
  return jax.lax.psum(jnp.where(held, rows, jnp.zeros_like(rows)), axis_name)


def _part(q, k, v, mask, scale: float) -> tuple[jax.Array, jax.Array]:
  """`q [b, q, h, d]` over `k, v [b, k, h, d]` under `mask [b, q, k]` ->
  `(out [b, q, h, d] float32, lse [b, q, h])`, normalised over these keys only."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32) * scale
  weights, lse = softmax_part(logits, mask[:, None])
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v).astype(jnp.float32)
  return out, jnp.swapaxes(lse, 1, 2)


def global_attention_local(q, k, v, positions, segment_ids, valid, slots, found, k_rows,
                           v_rows, *q_rows, window: int, axis_name: str, axis_size: int,
                           causal: bool, scale: float, block_size: int) -> jax.Array:
  """One device's part of window + global attention (call inside `shard_map`).

  Args:
    q, k, v: `[b, c_local, h, d]` local projections of this device's tokens.
    positions, segment_ids, valid: `[b, c_local]`.
    slots, found: `[b, g]` the chunk's global slots (same on every device).
    k_rows, v_rows: `[b, c_local, h, d]` keys and values of the global rows (K_g, V_g).
    *q_rows: optional `[b, g, h, d]` queries of the global rows (Q_g); without
      it the local queries at the global slots.
  Returns:
    `[b, c_local, h, d]` float32.
  """
  local_length = q.shape[1]
  local_slots, held = _local_slots(slots, local_length, axis_name)
  gather = functools.partial(_gather_global, local_slots=local_slots, held=held,
                             axis_name=axis_name)
  # Window part: a global key is attended through the global part only (counted once).
  window_valid = valid & ~global_tokens.global_key_flags(local_slots, local_length)
  out, lse = window_attention_local(q, k, v, positions, segment_ids, window_valid,
                                    window=window, axis_name=axis_name, axis_size=axis_size,
                                    causal=causal, scale=scale, block_size=block_size,
                                    return_lse=True)
  # Global keys part: every local query over the g gathered global tokens.
  g_pos, g_seg = gather(positions), gather(segment_ids)
  to_global = _part(q, gather(k), gather(v),
                    causal_document_mask(positions, segment_ids, g_pos, g_seg, found,
                                         causal=causal), scale)
  out = merge_parts([out, to_global[0]], [lse, to_global[1]])
  # Global rows: each device's part over its own keys, merged over the axis.
  q_g = q_rows[0] if q_rows else gather(q)
  mask = causal_document_mask(g_pos, g_seg, positions, segment_ids, valid,
                              causal=causal) & found[:, :, None]              # [b, g, c_local]
  row_out, row_lse = _part(q_g, k_rows, v_rows, mask, scale)
  outs = jax.lax.all_gather(row_out, axis_name)                               # [n, b, g, h, d]
  lses = jax.lax.all_gather(row_lse, axis_name)                               # [n, b, g, h]
  rows = merge_parts(list(outs), list(lses))
  return global_tokens.scatter_slots(out, local_slots, rows)


def sequence_parallel_global_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                       positions: jax.Array, segment_ids: jax.Array,
                                       valid: jax.Array, slots: jax.Array, found: jax.Array,
                                       *, mesh: jax.sharding.Mesh, window: int,
                                       causal: bool = False, scale: Optional[float] = None,
                                       block_size: Optional[int] = None,
                                       global_queries: Optional[jax.Array] = None,
                                       global_keys: Optional[jax.Array] = None,
                                       global_values: Optional[jax.Array] = None,
                                       batch_axes: tuple = ('data', 'fsdp'),
                                       head_axis: Optional[str] = 'tensor') -> jax.Array:
  """Longformer's window + global attention of a chunk split over `mesh`'s `sequence` axis.

  Equal to the unsplit `LongformerAttention` without a cache or dilation
  (tests/attention/test_sequence_parallel_memory.py).

  Args:
    q, k, v: `[batch, chunk, heads, head_dim]` local projections (rotated),
      natural (contiguous) order.
    positions, segment_ids, valid: `[batch, chunk]`, positions consecutive.
    slots, found: `[batch, g]` the global tokens' slots in the chunk and
      whether each is used (`global_tokens.first_global_slots`).
    window: one-sided reach, at most `chunk / n`.
    global_queries: `[batch, g, heads, head_dim]` Q_g of the global tokens
      (rotated); None: the local queries at `slots`.
    global_keys, global_values: `[batch, chunk, heads, head_dim]` K_g, V_g of
      every token; None: `k`, `v`.
  Returns:
    `[batch, chunk, heads, head_dim]` float32.
  """
  n, scale, block_size = split_settings(q, mesh, window, scale, block_size)
  heads = PartitionSpec(batch_axes, SEQUENCE_AXIS, head_axis, None)
  tokens = PartitionSpec(batch_axes, SEQUENCE_AXIS)
  replicated = PartitionSpec(batch_axes, None)
  arrays = (q, k, v, positions, segment_ids, valid, slots, found,
            k if global_keys is None else global_keys,
            v if global_values is None else global_values)
  in_specs = (heads,) * 3 + (tokens,) * 3 + (replicated,) * 2 + (heads,) * 2
  if global_queries is not None:
    arrays += (global_queries,)
    in_specs += (PartitionSpec(batch_axes, None, head_axis, None),)
  local = functools.partial(global_attention_local, window=window, axis_name=SEQUENCE_AXIS,
                            axis_size=n, causal=causal, scale=scale, block_size=block_size)
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=heads,
                       check_vma=False)(*arrays)

"""Softmax attention with the chunk's length split over the `sequence` mesh axis.

Queries, keys and values `[batch, chunk, heads, head_dim]` are sharded along
`chunk` over the `sequence` axis (and along `batch` over `data` x `fsdp`,
`heads` over `tensor`); each device computes the outputs of its own
queries under `shard_map`. Two ways to let them see every key:

  * `all_gather`: each device gathers all keys and values (with their
    positions, document ids and valid bits) and attends its queries to them
    with the dense masked softmax. Simple; per-device memory grows with the
    whole chunk (`[chunk / n, chunk]` logits).
  * `ring`: the key/value blocks travel around the ring of the n devices
    (`jax.lax.ppermute`, one hop per step, n - 1 hops). At each step a
    device attends its queries to the block it holds and merges that part
    exactly into its running result (online softmax: the same rescaling as
    `attention/core/partial_softmax.merge_parts`); the next block's transfer
    is issued before the current block's computation and does not depend on
    it, so the two overlap. Each block's weights are recomputed in the
    backward pass rather than stored. A block that the mask hides completely (a later
    device's keys under a causal mask, another document, padding) is
    skipped with `lax.cond`. Per-device memory is `[chunk / n, chunk / n]`
    logits (Liu et al., 2023, "Ring Attention with Blockwise Transformers").

With a cache (`memory`: Transformer-XL's FIFO of past tokens, keys
`[memory; chunk]`), the memory's keys and values are small and replicated
along the `sequence` axis: each device attends its queries to them as one
more part (its output and log-sum-exp) and merges that part exactly with
the ring's blocks (`merge_parts`); all-gather simply puts them in front of
the gathered keys. Only the chunk is split and balanced.

A per-pair logit bias that depends on the queries' and keys' absolute
positions (Transformer-XL's position term; `relative_attention.py`)
enters through `logit_bias(q_positions, k_positions, *bias_args)`, called
for every part with the local queries' positions and that part's keys'
positions; `bias_args` are this device's arrays (e.g. a per-device table).

Masks are functions of absolute positions and document ids
(docs/design.md, contract 2; `attention/core/masking.py`), never of array
slots, so both ways are exact in any token layout, including the
load-balanced zigzag of `load_balance.py`.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.core.partial_softmax import merge_parts, softmax_part
from longformer_jax.attention.sequence_parallel import load_balance as zigzag
from longformer_jax.parallel.mesh import SEQUENCE_AXIS

METHODS = ('all_gather', 'ring')


def _gather_keys(keys: tuple, axis_name: str) -> tuple:
  """Each of `keys` (`[b, c_local, ...]`) gathered along the length: `[b, chunk, ...]`."""
  return tuple(jax.lax.all_gather(a, axis_name, axis=1, tiled=True) for a in keys)


def all_gather_attention_local(q, k, v, positions, segment_ids, valid, *memory,
                               axis_name: str, causal: bool, scale: float,
                               logit_bias=None, bias_args: tuple = ()) -> jax.Array:
  """One device's part of all-gather attention (call inside `shard_map`).

  Args:
    q, k, v: `[b, c_local, h, d]` this device's queries, keys and values.
    positions, segment_ids, valid: `[b, c_local]` of this device's tokens.
    *memory: optional `(k_mem, v_mem [b, m, h, d], positions_mem, segments_mem,
      valid_mem [b, m])`, the same on every device of the axis.
    logit_bias, bias_args: optional `logit_bias(positions [b, c_local], k_positions [b, k],
      *bias_args) -> [b, h, c_local, k]`, added to the scaled logits.
  Returns:
    `[b, c_local, h, d]` in `q`'s dtype.
  """
  keys = _gather_keys((k, v, positions, segment_ids, valid), axis_name)
  if memory:   # [memory; gathered chunk]: one dense softmax over both
    keys = tuple(jnp.concatenate([m.astype(a.dtype), a], axis=1) for m, a in zip(memory, keys))
  k_all, v_all, k_pos, k_seg, k_valid = keys
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k_all) * jnp.asarray(scale, q.dtype)
  if logit_bias is not None:
    logits = logits + logit_bias(positions, k_pos, *bias_args)
  mask = causal_document_mask(positions, segment_ids, k_pos, k_seg, k_valid, causal=causal)
  return attend(logits, mask, v_all).astype(q.dtype)


def _block_part(q, k, v, mask, bias_inputs: tuple = (), *, scale: float,
                logit_bias=None) -> tuple[jax.Array, jax.Array]:
  """Attention of `q [b, q, h, d]` to one key block: `(out [b, q, h, d] f32, lse [b, q, h])`;
  `bias_inputs`: `(q_positions, k_positions, *bias_args)` for `logit_bias` (if any)."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) * jnp.asarray(scale, q.dtype)
  if logit_bias is not None:
    logits = logits + logit_bias(*bias_inputs)
  weights, lse = softmax_part(logits, mask[:, None])
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v).astype(jnp.float32)
  return out, jnp.swapaxes(lse, 1, 2)


def _merge_lse(lse_a: jax.Array, lse_b: jax.Array) -> jax.Array:
  """log(exp(a) + exp(b)), -inf where both are -inf, with finite gradients."""
  top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(jnp.maximum(lse_a, lse_b)),
                                        jnp.maximum(lse_a, lse_b), 0.0))
  total = jnp.exp(lse_a - top) + jnp.exp(lse_b - top)
  has_keys = total > 0
  return jnp.where(has_keys, top + jnp.log(jnp.where(has_keys, total, 1.0)), -jnp.inf)


def _memory_part(q, positions, segment_ids, memory: tuple, *, causal: bool, scale: float,
                 logit_bias=None, bias_args: tuple = ()) -> tuple[jax.Array, jax.Array]:
  """This device's queries over the replicated memory: `(out [b, c_local, h, d] f32,
  lse [b, c_local, h])`, a part for `merge_parts` (lse -inf where no entry is visible)."""
  k_m, v_m, m_pos, m_seg, m_valid = memory
  mask = causal_document_mask(positions, segment_ids, m_pos, m_seg, m_valid, causal=causal)
  compute = jax.checkpoint(functools.partial(_block_part, scale=scale, logit_bias=logit_bias))
  bias_inputs = (positions, m_pos) + tuple(bias_args) if logit_bias is not None else ()
  return compute(q, k_m.astype(q.dtype), v_m.astype(q.dtype), mask, bias_inputs)


def ring_attention_local(q, k, v, positions, segment_ids, valid, *memory, axis_name: str,
                         axis_size: int, causal: bool, scale: float,
                         skip_hidden_blocks: bool = True, logit_bias=None,
                         bias_args: tuple = ()) -> jax.Array:
  """One device's part of ring attention (call inside `shard_map`).

  Step s attends this device's queries to the block of device
  (i - s) mod n while that block moves on to device i + 1. The loop is
  unrolled (n is static and small), so XLA sees every transfer next to the
  computation it can overlap.

  Args:
    q, k, v: `[b, c_local, h, d]` this device's queries, keys and values.
    positions, segment_ids, valid: `[b, c_local]` of this device's tokens.
    axis_size: n, the size of the `axis_name` mesh axis.
    skip_hidden_blocks: skip (`lax.cond`) the computation of a block that
      the mask hides from every query of this device.
    *memory: optional `(k_mem, v_mem [b, m, h, d], positions_mem, segments_mem,
      valid_mem [b, m])`, the same on every device: the first part merged.
    logit_bias, bias_args: optional `logit_bias(positions [b, c_local], k_positions [b, k],
      *bias_args) -> [b, h, c_local, k]`, added to each part's scaled logits.
  Returns:
    `[b, c_local, h, d]` in `q`'s dtype.
  """
  ring = [(j, (j + 1) % axis_size) for j in range(axis_size)]
  block = (k, v, positions, segment_ids, valid)
  out = lse = None
  if memory:
    out, lse = _memory_part(q, positions, segment_ids, memory, causal=causal, scale=scale,
                            logit_bias=logit_bias, bias_args=bias_args)
  for step in range(axis_size):
    if step < axis_size - 1:   # issued first: the transfer overlaps this step's computation
      next_block = tuple(jax.lax.ppermute(a, axis_name, ring) for a in block)
    k_b, v_b, k_pos, k_seg, k_valid = block
    mask = causal_document_mask(positions, segment_ids, k_pos, k_seg, k_valid, causal=causal)
    # Rematerialised: the backward pass recomputes a block's weights instead
    # of keeping n blocks of `[b, h, c_local, c_local]` (as flash attention does).
    compute = jax.checkpoint(functools.partial(_block_part, scale=scale, logit_bias=logit_bias))
    bias_inputs = (positions, k_pos) + tuple(bias_args) if logit_bias is not None else ()
    if skip_hidden_blocks:
      hidden = lambda q_, k_, v_, m_, b_: (jnp.zeros(q_.shape[:3] + v_.shape[3:], jnp.float32),
                                           jnp.full(q_.shape[:3], -jnp.inf, jnp.float32))
      part = jax.lax.cond(jnp.any(mask), compute, hidden, q, k_b, v_b, mask, bias_inputs)
    else:
      part = compute(q, k_b, v_b, mask, bias_inputs)
    if out is None:
      out, lse = part
    else:
      out, lse = merge_parts([out, part[0]], [lse, part[1]]), _merge_lse(lse, part[1])
    if step < axis_size - 1:
      block = next_block
  return out.astype(q.dtype)


def sequence_parallel_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                positions: jax.Array, segment_ids: jax.Array, valid: jax.Array,
                                *, mesh: jax.sharding.Mesh, causal: bool = True,
                                method: str = 'ring', load_balance: bool = False,
                                scale: Optional[float] = None,
                                batch_axes: tuple = ('data', 'fsdp'),
                                head_axis: Optional[str] = 'tensor',
                                skip_hidden_blocks: bool = True,
                                memory: Optional[tuple] = None) -> jax.Array:
  """Masked softmax attention of a chunk split along its length over `mesh`'s `sequence` axis.

  Equal to the dense `dot_product.attend(q k^T * scale, causal_document_mask(...), v)`
  on one device, over the keys `[memory; chunk]` when `memory` is given
  (tests/attention/test_sequence_parallel.py, tests/attention/test_sequence_parallel_memory.py).

  Args:
    q, k, v: `[batch, chunk, heads, head_dim]` in natural token order
      (rotary positions already applied).
    positions, segment_ids: `[batch, chunk]` int, absolute stream positions
      and document ids; valid: `[batch, chunk]` bool, the key padding mask.
    mesh: with a `sequence` axis dividing `chunk` (2x it with load balancing).
    causal: causal (decoder) or bidirectional (encoder) mask.
    method: 'all_gather' or 'ring'.
    load_balance: permute the tokens into the zigzag layout before and back
      after (`load_balance.py`); a model permutes once at its input
      instead and passes `False`.
    scale: logit scale, default `1 / sqrt(head_dim)`.
    batch_axes, head_axis: the mesh axes that shard `batch` and `heads`.
    memory: optional `(k_mem, v_mem, positions_mem, segments_mem, valid_mem)`,
      `[batch, m, heads, head_dim]` x 2 and `[batch, m]` x 3: cached keys
      (rotated like `k`) that every query may also see under the same mask
      rules. Replicated along `sequence`, never permuted.
  Returns:
    `[batch, chunk, heads, head_dim]` in `q`'s dtype and natural order.
  """
  if method not in METHODS:
    raise ValueError(f'method {method!r} is not one of {METHODS}')
  n = mesh.shape[SEQUENCE_AXIS]
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  arrays = (q, k, v, positions, segment_ids, valid)
  if load_balance:
    arrays = tuple(zigzag.to_zigzag(a, n, axis=1) for a in arrays)
  heads = PartitionSpec(batch_axes, SEQUENCE_AXIS, head_axis, None)
  tokens = PartitionSpec(batch_axes, SEQUENCE_AXIS)
  if method == 'ring':
    local = functools.partial(ring_attention_local, axis_name=SEQUENCE_AXIS, axis_size=n,
                              causal=causal, scale=scale, skip_hidden_blocks=skip_hidden_blocks)
  else:
    local = functools.partial(all_gather_attention_local, axis_name=SEQUENCE_AXIS,
                              causal=causal, scale=scale)
  in_specs = (heads,) * 3 + (tokens,) * 3
  if memory is not None:   # the memory is whole on every device of the sequence axis
    arrays += tuple(memory)
    in_specs += (PartitionSpec(batch_axes, None, head_axis, None),) * 2 + (
        PartitionSpec(batch_axes, None),) * 3
  out = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=heads,
                      check_vma=False)(*arrays)
  return zigzag.from_zigzag(out, n, axis=1) if load_balance else out

"""Top-k over a memory whose capacity axis is sharded across devices.

`jax.lax.approx_max_k` raises when its database axis is sharded,
and a global top-k should not gather the whole score matrix anyway. So:
each shard takes its own top-k under `jax.shard_map`, the k candidates of
every shard (values and global indices) are all-gathered along the memory
mesh axis, and an exact top-k over the `shards * k` candidates picks the
global top-k. Ties resolve to the smallest global index, as in one
unsharded `jax.lax.top_k`.

Shapes: scores `[..., capacity]` -> values, indices `[..., k]`.
"""

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from longformer_jax.memory.block_top_k import block_top_k, worth_blocking

METHODS = ('exact', 'approx')


def top_k(scores: jax.Array, k: int, method: str = 'exact',
          recall_target: float = 0.95) -> tuple[jax.Array, jax.Array]:
  """Top-k along the last axis: exact (`lax.top_k`'s result, through block maxima on
  long axes: memory/block_top_k.py) or `lax.approx_max_k`."""
  if method == 'exact':
    if worth_blocking(scores.shape[-1], k):
      return block_top_k(scores, k)
    return jax.lax.top_k(scores, k)
  if method == 'approx':
    return jax.lax.approx_max_k(scores, k, recall_target=recall_target)
  raise ValueError(f'unknown top-k method {method!r}; choose one of {METHODS}')


def _mesh_axis_size(mesh, axis) -> int:
  names = axis if isinstance(axis, tuple) else (axis,)
  return math.prod(mesh.shape[name] for name in names)


def sharded_top_k(scores: jax.Array, k: int, *, mesh: jax.sharding.Mesh, memory_axis,
                  method: str = 'exact', recall_target: float = 0.95,
                  batch_axis=None) -> tuple[jax.Array, jax.Array]:
  """Global top-k of `scores [..., capacity]` sharded along capacity over `memory_axis`.

  Args:
    memory_axis: the mesh axis name (or tuple of names) sharding the last axis.
    batch_axis: optional mesh axis (or tuple) sharding the first axis.
  Returns:
    `(values [..., k], indices [..., k])`, indices global in [0, capacity),
    replicated along `memory_axis`.
  """
  capacity = scores.shape[-1]
  shards = _mesh_axis_size(mesh, memory_axis)
  if capacity % shards:
    raise ValueError(f'capacity {capacity} is not divisible by the {shards} shards of {memory_axis}')
  if k > capacity:
    raise ValueError(f'k = {k} exceeds the capacity {capacity}')
  shard_size = capacity // shards
  local_k = min(k, shard_size)
  leading = [None] * (scores.ndim - 1)
  if batch_axis is not None and leading:
    leading[0] = batch_axis
  in_spec = PartitionSpec(*leading, memory_axis)
  out_spec = PartitionSpec(*leading, None)

  def shard_top_k(block):
    values, indices = top_k(block, local_k, method, recall_target)
    offset = jax.lax.axis_index(memory_axis) * shard_size
    indices = indices.astype(jnp.int32) + offset.astype(jnp.int32)
    values = jax.lax.all_gather(values, memory_axis, axis=block.ndim - 1, tiled=True)
    indices = jax.lax.all_gather(indices, memory_axis, axis=block.ndim - 1, tiled=True)
    best, where = jax.lax.top_k(values, k)
    return best, jnp.take_along_axis(indices, where, axis=-1)

  return jax.shard_map(shard_top_k, mesh=mesh, in_specs=in_spec, out_specs=(out_spec, out_spec),
                       check_vma=False)(scores)

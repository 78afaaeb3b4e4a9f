"""KeyValueMemory: fixed-capacity (key, value) memory with top-k retrieval.

The Attendre interface's key-value memory: `insert` returns exactly what it
evicted, `retrieve(queries, k)` returns each query's top-k entries by dot
product (the Memorizing Transformer's kNN memory, Attendre's K/V memory).
A `MemoryEntries` whose data is `{'keys': [rows, M, heads, head_dim],
'values': [rows, M, heads, head_dim]}` (logical axes batch, memory, heads,
head_dim), plus `positions`, `segment_ids`, `valid`, `scores`, `clock` (the
LFA decay's T', memory/policies.py) `[rows, M]`.

Retrieval is per head (each head its own top-k, the Memorizing Transformer's
convention). Invalid entries are masked with -inf before the top-k and are
never returned as valid; when fewer than k entries are valid the remaining
results are flagged invalid. The top-k is `jax.lax.top_k`'s ('exact'; on
memories of 4,096 entries and more filled to at most 3/4, computed tile by
tile without the score matrix: memory/tiled_top_k.py) or
`jax.lax.approx_max_k` ('approx', with `recall_target`; exact on CPU). With
a mesh whose `memory_axis` shards the capacity axis, the top-k goes through
sharded_retrieval.sharded_top_k (per-shard top-k, gather, final top-k).

Per-head memories (`per_head_rows=True`): rows = batch * heads, one head per
row (entries.heads_to_rows on keys, values and queries).
"""

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from longformer_jax.memory import entries as entries_lib
from longformer_jax.memory.entries import MemoryEntries
from longformer_jax.memory.insertion import insert_entries
from longformer_jax.memory.policies import EvictionPolicy
from longformer_jax.memory.block_top_k import block_top_k, worth_blocking
from longformer_jax.memory.sharded_retrieval import sharded_top_k, top_k
from longformer_jax.memory import tiled_top_k as tiled_top_k_lib
from longformer_jax.memory.tiled_top_k import tiled_top_k, worth_tiling

# The tiled top-k is used while at most this fraction of the memory is filled (the passkey
# kNN step on a 2-core CPU: tiled 0.68 s half full, 1.00 s full; the whole matrix 0.85-0.88 s).
TILED_UP_TO = 0.75


@flax.struct.dataclass
class Retrieved:
  """Each query's top-k memory entries, per head. Layout `[batch, q, heads, k, ...]`."""
  keys: jax.Array          # [b, q, h, k, d]
  values: jax.Array        # [b, q, h, k, d]
  positions: jax.Array     # [b, q, h, k] int32
  segment_ids: jax.Array   # [b, q, h, k] int32
  similarities: jax.Array  # [b, q, h, k] float32 scaled dot products, -inf where invalid
  valid: jax.Array         # [b, q, h, k] bool
  indices: jax.Array       # [b, q, h, k] int32 memory slots


def create(batch_size: int, capacity: int, num_heads: int, head_dim: int, dtype=jnp.float32, *,
           per_head_rows: bool = False) -> MemoryEntries:
  """An empty key-value memory (all entries invalid).

  `per_head_rows`: batch_size * num_heads rows of one head each (per-head eviction).
  """
  rows, heads = (batch_size * num_heads, 1) if per_head_rows else (batch_size, num_heads)
  zeros = jnp.zeros((rows, capacity, heads, head_dim), dtype)
  return MemoryEntries(
      data={'keys': zeros, 'values': zeros},
      positions=jnp.zeros((rows, capacity), jnp.int32),
      segment_ids=jnp.zeros((rows, capacity), jnp.int32),
      valid=jnp.zeros((rows, capacity), bool),
      scores=jnp.zeros((rows, capacity), jnp.float32),
      clock=jnp.full((rows, capacity), entries_lib.NO_CLOCK, jnp.int32),
      data_axes=(None if per_head_rows else 'heads', 'head_dim'))


def entries_from_chunk(keys: jax.Array, values: jax.Array, positions: jax.Array,
                       segment_ids: jax.Array, valid: jax.Array) -> MemoryEntries:
  """New entries from a chunk's `keys, values [b, n, h, d]` and `[b, n]` metadata."""
  return entries_lib.entries_from_chunk({'keys': keys, 'values': values}, positions,
                                        segment_ids, valid)


def insert(memory: MemoryEntries, new: MemoryEntries,
           policy: EvictionPolicy) -> tuple[MemoryEntries, MemoryEntries]:
  """Inserts n (key, value) entries; returns `(memory, evicted)`, exactly n evicted
  (see memory/insertion.py)."""
  return insert_entries(memory, new, policy)


def get_all(memory: MemoryEntries) -> MemoryEntries:
  """The whole content (invalid entries included, flagged by `valid`); slots unordered."""
  return memory


def clear_rows(memory: MemoryEntries, reset: jax.Array) -> MemoryEntries:
  """Invalidates every entry of the rows where `reset [rows]` is set."""
  return entries_lib.clear_rows(memory, reset)


def similarities(memory: MemoryEntries, queries: jax.Array, scale: float | None = None,
                 masked: bool = True) -> jax.Array:
  """`[b, h, q, M]` float32 (scaled) dot products of `queries [b, q, h, d]` with the keys;
  -inf at invalid entries (`masked=False`: left as they are)."""
  scores = jnp.einsum('bqhd,bmhd->bhqm', queries, memory.data['keys'],
                      preferred_element_type=jnp.float32)
  if scale is not None:
    scores = scores * jnp.float32(scale)
  if masked:
    scores = jnp.where(memory.valid[:, None, None, :], scores, -jnp.inf)
  return nn.with_logical_constraint(scores, ('batch', 'heads', 'length', 'memory'))


def _gather_per_head(leaf: jax.Array, indices: jax.Array) -> jax.Array:
  """`leaf [b, M, h, ...]` at `indices [b, h, q, k]` -> `[b, q, h, k, ...]`."""
  b, h, q, k = indices.shape
  per_head = jnp.moveaxis(leaf, 2, 1)                                  # [b, h, M, ...]
  flat = indices.reshape(b, h, q * k)
  flat = flat.reshape(flat.shape + (1,) * (per_head.ndim - 3))
  taken = jnp.take_along_axis(per_head, flat, axis=2)                  # [b, h, q*k, ...]
  taken = taken.reshape((b, h, q, k) + per_head.shape[3:])
  return jnp.moveaxis(taken, 1, 2)


def _gather_metadata(field: jax.Array, indices: jax.Array) -> jax.Array:
  """`field [b, M]` at `indices [b, h, q, k]` -> `[b, q, h, k]`."""
  taken = jnp.take_along_axis(field, indices.reshape(indices.shape[0], -1), axis=1)
  return jnp.moveaxis(taken.reshape(indices.shape), 1, 2)


def _untiled_top_k(memory: MemoryEntries, queries: jax.Array, k: int, scale):
  """The exact top-k from the whole `[b, h, q, M]` score matrix: block maxima with the
  validity mask fused in (no masked copy of the scores) where worth it, else lax.top_k."""
  if worth_blocking(memory.capacity, k):
    scores = similarities(memory, queries, scale, masked=False)       # [b, h, q, M]
    return block_top_k(scores, k, valid=memory.valid[:, None, None, :])
  values, indices = top_k(similarities(memory, queries, scale), k)
  return values, indices.astype(jnp.int32)


def retrieve(memory: MemoryEntries, queries: jax.Array, k: int, *, scale: float | None = None,
             method: str = 'exact', recall_target: float = 0.95, mesh=None,
             memory_axis=None, batch_axis=None) -> Retrieved:
  """Each query's top-k entries per head by (scaled) dot product.

  Args:
    queries: `[b, q, h, d]` (h = the memory's heads).
    k: results per (query, head); when k > capacity the extra results are invalid.
    scale: multiplies the dot products (None: unscaled).
    method: 'exact' (`lax.top_k`'s result; through block maxima on long memories,
      memory/block_top_k.py, and tile by tile on longer ones, memory/tiled_top_k.py) or
      'approx' (`lax.approx_max_k`, `recall_target`).
    mesh, memory_axis: when given, the capacity axis is sharded over the mesh
      axis `memory_axis` and the per-shard top-k path is used; `batch_axis`
      (optional) is the mesh axis sharding the batch rows there.
  Returns:
    `Retrieved` with layout `[b, q, h, k, ...]`. Gradients reach the memory through the
    gathered keys and values; `similarities` rank and mask, and from the tiled search
    (memory/tiled_top_k.py) they carry none.
  """
  capacity = memory.capacity
  if capacity == 0 or k <= 0:
    raise ValueError(f'retrieval needs capacity > 0 and k > 0, got capacity {capacity}, k {k}')
  found = min(k, capacity)
  sharded = mesh is not None and memory_axis is not None
  if method == 'exact' and not sharded and worth_tiling(capacity, found):
    # Tile by tile (no [b, h, q, M] score matrix, only the filled tiles read) while at most
    # TILED_UP_TO of the memory is filled; fuller, the whole matrix at once is faster on a
    # CPU (docs/benchmarks.md, Retrieval). One branch runs; both give lax.top_k's entries.
    tiles = tiled_top_k_lib.filled_tiles(memory.valid)
    values, indices = jax.lax.cond(
        tiles * tiled_top_k_lib.TILE <= TILED_UP_TO * capacity,
        lambda: tiled_top_k(memory.data['keys'], memory.valid, queries, found, scale, tiles),
        lambda: _untiled_top_k(memory, queries, found, scale))
  elif method == 'exact' and not sharded:
    values, indices = _untiled_top_k(memory, queries, found, scale)
  elif sharded:
    scores = similarities(memory, queries, scale)                     # [b, h, q, M]
    values, indices = sharded_top_k(scores, found, mesh=mesh, memory_axis=memory_axis,
                                    method=method, recall_target=recall_target,
                                    batch_axis=batch_axis)
  else:
    values, indices = top_k(similarities(memory, queries, scale), found, method, recall_target)
  indices = indices.astype(jnp.int32)
  if found < k:
    pad = [(0, 0)] * 3 + [(0, k - found)]
    values = jnp.pad(values, pad, constant_values=-jnp.inf)
    indices = jnp.pad(indices, pad)
  values = jnp.moveaxis(values, 1, 2)                                 # [b, q, h, k]
  valid = _gather_metadata(memory.valid, indices) & jnp.isfinite(values)
  if found < k:
    valid = valid & (jnp.arange(k) < found)
  item_axes = ('batch', 'length', 'heads', None, 'head_dim')
  return Retrieved(keys=nn.with_logical_constraint(_gather_per_head(memory.data['keys'], indices),
                                                   item_axes),
                   values=nn.with_logical_constraint(_gather_per_head(memory.data['values'], indices),
                                                     item_axes),
                   positions=_gather_metadata(memory.positions, indices),
                   segment_ids=_gather_metadata(memory.segment_ids, indices),
                   similarities=jnp.where(valid, values, -jnp.inf),
                   valid=valid,
                   indices=jnp.moveaxis(indices, 1, 2))

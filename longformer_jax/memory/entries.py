"""Memory entries: what a memory stores, what is inserted and what is evicted.

Every memory of this package (data-only or key-value) is a `MemoryEntries`
pytree of fixed shape with one memory per row. Each entry carries its
absolute stream position, its document (segment) id, a valid bit and a
policy score, so masks are computed from positions, never from slots
(docs/design.md, contract 2), and eviction policies rank entries by score.

Shapes (`rows` is the batch, or batch * heads for per-head memories):
  data:        a pytree whose leaves are `[rows, n, *features]`
               (data-only: one array; key-value: {'keys', 'values'} of
               `[rows, n, heads, head_dim]`)
  positions:   `[rows, n]` int32 absolute stream position
  segment_ids: `[rows, n]` int32 document id (metadata)
  valid:       `[rows, n]` bool
  scores:      `[rows, n]` float32 eviction-policy score (higher = keep)
  clock:       `[rows, n]` int32 the position up to which the entry's score
               is brought: the largest position of a valid query folded
               into it, `NO_CLOCK` before any (the T' of the LFA decay,
               memory/policies.py). Every valid entry of a row carries the
               same value, the row's T' (`row_clock`): kept per entry so
               that every leaf of a memory is `[rows, capacity, ...]`.

Per-head memories (each head evicts on its own scores) treat (batch, head)
as rows: row `b * heads + h`; `heads_to_rows` / `rows_to_heads` /
`repeat_rows` convert between the two layouts.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

# `MemoryEntries.clock` of an entry whose score no valid query has added to yet.
NO_CLOCK = int(jnp.iinfo(jnp.int32).min)


@flax.struct.dataclass
class MemoryEntries:
  """Entries of one memory per row; leaves `[rows, n, ...]`."""
  data: Any                # pytree of [rows, n, *features]
  positions: jax.Array     # [rows, n] int32
  segment_ids: jax.Array   # [rows, n] int32
  valid: jax.Array         # [rows, n] bool
  scores: jax.Array        # [rows, n] float32
  # [rows, n] int32: the largest position of a valid query folded into the
  # score, NO_CLOCK if none (None: entries built by hand, without one).
  clock: jax.Array | None = None
  # Logical names of the feature axes of every data leaf (after ('batch',
  # 'memory')), a tuple such as ('heads', 'head_dim'); None: unnamed.
  data_axes: tuple | None = flax.struct.field(pytree_node=False, default=None)

  @property
  def capacity(self) -> int:
    return self.positions.shape[1]

  @property
  def rows(self) -> int:
    return self.positions.shape[0]

  def logical_axes(self) -> 'MemoryEntries':
    """The same dataclass with a tuple of logical axis names per array."""
    row_axes = ('batch', 'memory')
    def names(leaf):
      # data_axes names the feature axes of the leaves that have them; a `[rows, n]` leaf
      # (a flag per entry) has none.
      features = self.data_axes if self.data_axes is not None else ()
      return row_axes + (tuple(features) if len(features) == leaf.ndim - 2
                         else (None,) * (leaf.ndim - 2))
    data = jax.tree_util.tree_map(names, self.data)
    return MemoryEntries(data=data, positions=row_axes, segment_ids=row_axes, valid=row_axes,
                         scores=row_axes, clock=None if self.clock is None else row_axes,
                         data_axes=self.data_axes)


def entries_from_chunk(data, positions: jax.Array, segment_ids: jax.Array,
                       valid: jax.Array, data_axes=None) -> MemoryEntries:
  """Entries for a chunk: `data` leaves `[rows, n, ...]`, the rest `[rows, n]`; scores 0."""
  return MemoryEntries(data=data, positions=positions.astype(jnp.int32),
                       segment_ids=segment_ids.astype(jnp.int32), valid=valid.astype(bool),
                       scores=jnp.zeros(positions.shape, jnp.float32),
                       clock=jnp.full(positions.shape, NO_CLOCK, jnp.int32), data_axes=data_axes)


def invalid_like(entries: MemoryEntries) -> MemoryEntries:
  """Entries of the same shapes, all zero and invalid."""
  return jax.tree_util.tree_map(jnp.zeros_like, entries)


def take_entries(entries: MemoryEntries, indices: jax.Array) -> MemoryEntries:
  """Entries at `indices [rows, m]` of each row (a gather along the entry axis)."""
  def take(leaf):
    index = indices.reshape(indices.shape + (1,) * (leaf.ndim - 2))
    return jnp.take_along_axis(leaf, index, axis=1)
  return jax.tree_util.tree_map(take, entries)


def concat_entries(first: MemoryEntries, second: MemoryEntries) -> MemoryEntries:
  """Entries of `first` followed by those of `second` along the entry axis."""
  return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=1),
                                first, second)


def clear_rows(entries: MemoryEntries, reset: jax.Array) -> MemoryEntries:
  """Invalidates (and zeroes the scores of) every entry of rows where `reset [rows]` is set;
  their clock goes back to NO_CLOCK (the row's T' is reset with it)."""
  keep = ~reset[:, None]
  cleared = entries.replace(valid=entries.valid & keep,
                            scores=jnp.where(keep, entries.scores, 0.0))
  if entries.clock is None:
    return cleared
  return cleared.replace(clock=jnp.where(keep, entries.clock, NO_CLOCK))


def row_clock(entries: MemoryEntries) -> jax.Array:
  """`[rows]` the row's T': the largest clock of a valid entry (NO_CLOCK if none)."""
  return jnp.max(jnp.where(entries.valid, entries.clock, NO_CLOCK), axis=1,
                 initial=NO_CLOCK)


def heads_to_rows(x: jax.Array) -> jax.Array:
  """`[batch, n, heads, ...]` -> `[batch * heads, n, 1, ...]` (row b * heads + h)."""
  batch, n, heads = x.shape[:3]
  moved = jnp.moveaxis(x, 2, 1)                       # [batch, heads, n, ...]
  return moved.reshape((batch * heads, n, 1) + x.shape[3:])


def rows_to_heads(x: jax.Array, heads: int) -> jax.Array:
  """`[batch * heads, n, 1, ...]` -> `[batch, n, heads, ...]` (inverse of `heads_to_rows`)."""
  rows, n = x.shape[:2]
  split = x.reshape((rows // heads, heads, n) + x.shape[3:])
  return jnp.moveaxis(split, 1, 2)


def repeat_rows(x: jax.Array, heads: int) -> jax.Array:
  """`[batch, ...]` -> `[batch * heads, ...]`, row b * heads + h = x[b] (positions, valid, reset)."""
  return jnp.repeat(x, heads, axis=0)

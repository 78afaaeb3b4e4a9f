"""A first-in-first-out, data-only memory: the Transformer-XL cache.

A pure-functional pytree of fixed shape. Every entry carries its absolute
stream position, its document (segment) id and a valid bit, so attention
masks are computed from positions, never from slots (docs/design.md, contract 2).

It follows the Attendre memory interface: `insert` returns exactly the
entries it evicted, and `get_all` returns the contents.

Shapes: `values [batch, capacity, *feature_shape]`; `positions`,
`segment_ids`, `valid` are `[batch, capacity]`. Entries are ordered oldest
first, so with a continuous stream slot j holds position `p0 - capacity + j`
where p0 is the position of the next token to be inserted.
"""

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class FifoMemory:
  values: jax.Array       # [batch, capacity, *features]
  positions: jax.Array    # [batch, capacity] int32
  segment_ids: jax.Array  # [batch, capacity] int32
  valid: jax.Array        # [batch, capacity] bool

  @property
  def capacity(self) -> int:
    return self.positions.shape[1]

  def logical_axes(self) -> 'FifoMemory':
    """Axis names of each field: hidden states `[batch, memory, embed]`, or
    per-head features `[batch, memory, heads, head_dim]`."""
    features = {3: ('embed',), 4: ('heads', 'head_dim')}.get(
        self.values.ndim, (None,) * (self.values.ndim - 2))
    return FifoMemory(values=('batch', 'memory') + features, positions=('batch', 'memory'),
                      segment_ids=('batch', 'memory'), valid=('batch', 'memory'))


def create(batch_size: int, capacity: int, feature_shape: Sequence[int],
           dtype=jnp.float32) -> FifoMemory:
  """An empty memory: all entries invalid."""
  return FifoMemory(
      values=jnp.zeros((batch_size, capacity, *feature_shape), dtype),
      positions=jnp.zeros((batch_size, capacity), jnp.int32),
      segment_ids=jnp.zeros((batch_size, capacity), jnp.int32),
      valid=jnp.zeros((batch_size, capacity), bool))


def clear_rows(memory: FifoMemory, reset: jax.Array) -> FifoMemory:
  """Invalidates every entry of the rows where `reset [batch]` is set."""
  return memory.replace(valid=memory.valid & ~reset[:, None])


def get_all(memory: FifoMemory) -> FifoMemory:
  """The whole content (invalid entries included, flagged by `valid`)."""
  return memory


def concat(older: FifoMemory, newer: FifoMemory) -> FifoMemory:
  """Entries of `older` followed by those of `newer` along the capacity axis."""
  return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=1),
                                older, newer)


def insert(memory: FifoMemory, new: FifoMemory) -> tuple[FifoMemory, FifoMemory]:
  """Appends the n entries of `new`; the n oldest entries fall out.

  Returns:
    `(memory, evicted)`: the memory with the same capacity, and exactly the n
    entries evicted (oldest first; invalid ones where there was room).
  """
  n = new.positions.shape[1]
  combined = concat(memory, new)
  evicted = jax.tree_util.tree_map(lambda a: a[:, :n], combined)
  kept = jax.tree_util.tree_map(lambda a: a[:, n:], combined)
  return kept, evicted

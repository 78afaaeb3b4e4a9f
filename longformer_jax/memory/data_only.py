"""DataOnlyMemory: a fixed-capacity memory of arbitrary features per row.

The Attendre interface's data-only memory (`insert` returns what it
evicted; `get_all` returns the contents): the XL-style cache with any
eviction policy, compressed memories, encoder outputs.
A `MemoryEntries` whose `data` is one array `[rows, capacity, *features]`;
`positions`, `segment_ids`, `valid`, `scores`, `clock` (the LFA decay's
T', memory/policies.py) are `[rows, capacity]`.

It cannot hold Attendre's Q memory: an insert evicts invalid entries first,
so padding never displaces a valid entry, and a row's pending queries could
never be flushed or drained out with padding. The Q memory is the shift
register of memory/fifo.py, in which padding pushes the oldest queries out.

Rows are the batch, or (batch, head) pairs for per-head policies
(`score_heads=H`: batch * H rows, row b * H + h; see entries.heads_to_rows).

Example:
  memory = data_only.create(batch, 256, (d_model,), jnp.float32)
  new = entries.entries_from_chunk(hidden, ctx.positions, ctx.segment_ids, ctx.valid)
  memory, evicted = data_only.insert(data_only.clear_rows(memory, ctx.reset), new, policy)
"""

from typing import Sequence

import jax
import jax.numpy as jnp

from longformer_jax.memory import entries as entries_lib
from longformer_jax.memory.entries import MemoryEntries
from longformer_jax.memory.insertion import insert_entries
from longformer_jax.memory.policies import EvictionPolicy


def create(batch_size: int, capacity: int, feature_shape: Sequence[int], dtype=jnp.float32, *,
           score_heads: int | None = None, feature_axes: tuple | None = None) -> MemoryEntries:
  """An empty memory (all entries invalid) of `[rows, capacity, *feature_shape]`.

  `score_heads`: one row per (batch, head), rows = batch_size * score_heads.
  `feature_axes`: logical names of the feature axes, e.g. ('embed',).
  """
  rows = batch_size * (score_heads or 1)
  if feature_axes is not None and len(feature_axes) != len(feature_shape):
    raise ValueError(f'feature_axes {feature_axes} do not match feature_shape {feature_shape}')
  return MemoryEntries(
      data=jnp.zeros((rows, capacity, *feature_shape), dtype),
      positions=jnp.zeros((rows, capacity), jnp.int32),
      segment_ids=jnp.zeros((rows, capacity), jnp.int32),
      valid=jnp.zeros((rows, capacity), bool),
      scores=jnp.zeros((rows, capacity), jnp.float32),
      clock=jnp.full((rows, capacity), entries_lib.NO_CLOCK, jnp.int32),
      data_axes=None if feature_axes is None else tuple(feature_axes))


def insert(memory: MemoryEntries, new: MemoryEntries,
           policy: EvictionPolicy) -> tuple[MemoryEntries, MemoryEntries]:
  """Inserts the n entries of `new` (data `[rows, n, *features]`).

  Returns `(memory, evicted)` with exactly n evicted entries (invalid where
  there was room), in eviction order; see memory/insertion.py.
  """
  return insert_entries(memory, new, policy)


def get_all(memory: MemoryEntries) -> MemoryEntries:
  """The whole content (invalid entries included, flagged by `valid`); slots unordered."""
  return memory


def clear_rows(memory: MemoryEntries, reset: jax.Array) -> MemoryEntries:
  """Invalidates every entry of the rows where `reset [rows]` is set."""
  return entries_lib.clear_rows(memory, reset)

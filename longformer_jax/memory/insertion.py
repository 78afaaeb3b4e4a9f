"""Insertion with eviction: the one insert of data-only and key-value memories.

`insert_entries(memory, new, policy)` puts the n new entries into the fixed
capacity M of each row and returns exactly n evicted entries:

- Free (invalid) slots are filled first; the evicted output then holds
  invalid entries for them.
- Otherwise the policy's ranking (policies.eviction_keys) picks the victims:
  lowest score, oldest position on ties, sinks and the recent window last.
  With `admission='always'` the victims are existing entries and new
  entries always go in, except when n > M: then the oldest new entries (by
  the same ranking) are evicted as well. With `admission='score'` new
  entries compete on their initial score, and may be evicted at once.
- New entries get the policy's initial score (mean - k * std of the
  memory's valid scores); their own `scores` field is ignored.
- New entries take the row's clock (entries.row_clock, the LFA decay's
  T'): their initial score is as of the memory's scores.

The evicted entries come in eviction order (invalid ones first). Surviving
entries keep their slots and new entries are written into the victims'
slots, so slot order is not position order: use positions, never slots.

Cost per row: the first n of the M + n candidates' order
(partial_ranking.first_in_order: block minima, then a sort of the n blocks
holding them; one sort over M + n on small memories), a sort of the n
victims and a scatter of n entries; the memory's data is never copied
whole.
"""

import jax
import jax.numpy as jnp

from longformer_jax.memory import partial_ranking, policies
from longformer_jax.memory import entries as entries_lib
from longformer_jax.memory.entries import MemoryEntries, take_entries


def metadata(entries: MemoryEntries) -> MemoryEntries:
  """The entries without their data (cheap to concatenate)."""
  return entries.replace(data=None)


def _victims(policy, memory: MemoryEntries, new: MemoryEntries) -> jax.Array:
  """`[rows, n]` the n candidates evicted (memory slots, or M + new index), first evicted
  first."""
  memory_meta, new_meta = metadata(memory), metadata(new)
  candidates = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=1),
                                      memory_meta, new_meta)
  is_new = jnp.concatenate([jnp.zeros(memory.positions.shape, bool),
                            jnp.ones(new.positions.shape, bool)], axis=1)
  keys = policies.eviction_keys(policy, candidates, is_new)
  return partial_ranking.first_in_order(keys, new.capacity)


def _gather_candidates(memory: MemoryEntries, new: MemoryEntries, indices: jax.Array):
  """Candidates at `indices [rows, m]` (< M: memory slot, >= M: new entry index + M)."""
  capacity, n = memory.capacity, new.capacity
  from_memory = take_entries(memory, jnp.clip(indices, 0, capacity - 1))
  from_new = take_entries(new, jnp.clip(indices - capacity, 0, n - 1))
  in_memory = indices < capacity

  def select(a, b):
    return jnp.where(in_memory.reshape(in_memory.shape + (1,) * (a.ndim - 2)), a, b)
  return jax.tree_util.tree_map(select, from_memory, from_new)


def _stable_order(flags: jax.Array) -> jax.Array:
  """`[rows, n]` indices with the False entries first, each group in index order."""
  slots = jnp.broadcast_to(jnp.arange(flags.shape[1], dtype=jnp.int32), flags.shape)
  return jax.lax.sort((flags.astype(jnp.int32), slots), dimension=1, num_keys=1)[1]


def _write_new(memory: MemoryEntries, new: MemoryEntries, victims: jax.Array) -> MemoryEntries:
  """Writes the kept new entries into the slots of the evicted memory entries (`victims
  [rows, n]`, as `_victims` returns them)."""
  capacity, n = memory.capacity, new.capacity
  writes = min(n, capacity)
  slot_victim = victims < capacity
  # The evicted slots in slot order (past the memory: none), then the kept new entries.
  free_slots = jnp.sort(jnp.where(slot_victim, victims, capacity), axis=1)[:, :writes]
  rows = jnp.arange(memory.rows)[:, None]
  new_victim = jnp.zeros((memory.rows, n + 1), bool).at[
      rows, jnp.where(slot_victim, n, victims - capacity)].set(True)[:, :n]
  kept_new = _stable_order(new_victim)[:, :writes]         # kept new entries first
  num_writes = jnp.sum(slot_victim, axis=1)                # == number of kept new entries
  targets = jnp.where(jnp.arange(writes)[None, :] < num_writes[:, None], free_slots, capacity)
  incoming = take_entries(new, kept_new)

  def write(leaf, update):
    return leaf.at[rows, targets].set(update.astype(leaf.dtype), mode='drop')
  return jax.tree_util.tree_map(write, memory, incoming)


def insert_entries(memory: MemoryEntries, new: MemoryEntries,
                   policy: policies.EvictionPolicy) -> tuple[MemoryEntries, MemoryEntries]:
  """Inserts `new` (leaves `[rows, n, ...]`) into `memory` (`[rows, M, ...]`).

  Returns:
    `(memory, evicted)`: the memory (same shapes) and exactly n evicted
    entries `[rows, n, ...]` in eviction order (invalid ones where there was
    room).
  """
  if new.rows != memory.rows:
    raise ValueError(f'new entries have {new.rows} rows, the memory {memory.rows}')
  new = new.replace(scores=jnp.broadcast_to(policies.initial_scores(policy, memory)[:, None],
                                            new.positions.shape),
                    clock=None if memory.clock is None else jnp.broadcast_to(
                        entries_lib.row_clock(memory)[:, None], new.positions.shape),
                    data_axes=memory.data_axes)
  new = jax.tree_util.tree_map(lambda a, b: b.astype(a.dtype), memory, new)
  n = new.capacity
  if memory.capacity == 0 or n == 0:
    return memory, new
  victims = _victims(policy, memory, new)
  evicted = _gather_candidates(memory, new, victims)
  return _write_new(memory, new, victims), evicted

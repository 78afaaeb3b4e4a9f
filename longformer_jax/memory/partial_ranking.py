"""The first n items of a lexicographic order, without sorting every item.

Insertion into a memory of M entries evicts n of M + n candidates: the first
n of the policy's lexicographic order (policies.eviction_keys, then the slot
index, which makes the order total). A sort over all M + n candidates costs
O((M + n) log(M + n)) comparisons of up to six keys, which on a CPU is most
of an insertion into a memory of 65,536 entries (0.68 s of 1.16 s for 16
rows). Only the first n are needed, so:

  1. cut the candidates into blocks of `block` and take each block's
     lexicographic minimum (one masked min per key, key by key);
  2. sort the block minima and keep the n blocks with the smallest;
  3. sort the n * block items of those blocks and keep the first n.

Exact: the order is total, so the n first items are unique. If an item x
among them lay in a block whose minimum ranked after n others, those n
blocks would each hold an item smaller than x, so x would not be among the
first n. Hence the n first items lie in the n chosen blocks.
"""

import jax
import jax.numpy as jnp

DEFAULT_BLOCK = 64


def _sort_order(keys: tuple, slots: jax.Array) -> jax.Array:
  """`slots` reordered by `(keys..., slots)` along axis 1 (ascending)."""
  return jax.lax.sort(tuple(keys) + (slots,), dimension=1, num_keys=len(keys) + 1)[-1]


def _block_minima(keys: tuple, slots: jax.Array) -> tuple:
  """Per block (last axis), the lexicographic minimum of `(keys..., slots)`, key by key:
  each key's minimum among the items that tie on every key before it."""
  tied = jnp.ones(slots.shape, bool)
  minima = []
  for key in tuple(keys) + (slots,):
    if jnp.issubdtype(key.dtype, jnp.floating):
      top = jnp.array(jnp.inf, key.dtype)
    else:
      top = jnp.array(jnp.iinfo(key.dtype).max, key.dtype)
    least = jnp.min(jnp.where(tied, key, top), axis=-1)
    tied = tied & (key == least[..., None])
    minima.append(least)
  return tuple(minima)


def first_in_order(keys: tuple, n: int, block: int | None = None) -> jax.Array:
  """`[rows, n]` int32: the indices (along axis 1) of the first n items in the order of
  `keys` (each `[rows, L]`, compared lexicographically, then by index), first first.

  Equals `lax.sort(keys + (arange(L),), num_keys=len(keys) + 1)[-1][:, :n]`. Blocks of
  `block` items (None: `DEFAULT_BLOCK`, read at the call) where there are at least 4n of
  them; otherwise that one sort.
  """
  block = block or DEFAULT_BLOCK
  rows, length = keys[0].shape
  if not 1 <= n <= length:
    raise ValueError(f'n = {n} must be in [1, {length}]')
  slots = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
  num_blocks = -(-length // block)
  if num_blocks < 4 * n:
    return _sort_order(keys, slots)[:, :n]
  pad = num_blocks * block - length
  if pad:
    # Padded items carry slot indices past every real one and the largest keys, so they
    # sort last and are never among the first n (n <= length).
    def widen(a):
      fill = jnp.inf if jnp.issubdtype(a.dtype, jnp.floating) else jnp.iinfo(a.dtype).max
      return jnp.pad(a, [(0, 0), (0, pad)], constant_values=fill)
    keys = tuple(widen(k) for k in keys)
    slots = jnp.broadcast_to(jnp.arange(num_blocks * block, dtype=jnp.int32),
                             (rows, num_blocks * block))
  blocked = lambda a: a.reshape(rows, num_blocks, block)
  minima = _block_minima(tuple(blocked(k) for k in keys), blocked(slots))   # [rows, B] each
  block_ids = jnp.broadcast_to(jnp.arange(num_blocks, dtype=jnp.int32), (rows, num_blocks))
  chosen = _sort_order(minima, block_ids)[:, :n]                           # [rows, n]
  take = lambda a: jnp.take_along_axis(blocked(a), chosen[..., None], axis=1).reshape(rows, -1)
  candidate_slots = take(slots)                                            # [rows, n * block]
  order = _sort_order(tuple(take(k) for k in keys), candidate_slots)
  return order[:, :n]

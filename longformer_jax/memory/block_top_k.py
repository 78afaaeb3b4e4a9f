"""Exact top-k over a long last axis by way of block maxima.

`jax.lax.top_k` over `[..., M]` scores with M in the tens of thousands costs
several times the matmul that made the scores on CPU (one sequential pass
that keeps a k-heap per row). Most of that work is wasted: the k best
entries can only sit in the k blocks with the best maxima. So:

  1. cut the last axis into blocks of `block` entries (padding with -inf),
     and take each block's maximum (one vectorised reduction);
  2. pick the k blocks with the best maxima (`top_k` over M / block values);
  3. gather those k blocks (k * block candidates) and take the top-k there.

Why it is exact: order entries by (value descending, index ascending), the
order `lax.top_k` resolves ties by. A block's best entry is its maximum with
the smallest index. If an entry x of the top-k lay in a block B outside the
k best blocks, those k blocks' best entries would be k distinct entries
ahead of B's best entry, hence ahead of x, and x would not be in the top-k.
Step 2's `lax.top_k` ranks equal maxima by block index, which is the same
order because blocks are contiguous. Step 3 keeps ties in index order by
gathering the chosen blocks sorted by block index. So values and indices
equal `lax.top_k`'s, ties (e.g. the -inf scores of invalid entries) included.

Cost: one read of the scores for the maxima, a top-k over M / block values
and one over k * block candidates, against a k-heap pass over all M.
"""

from typing import Optional

import jax
import jax.numpy as jnp

DEFAULT_BLOCK = 64


def worth_blocking(length: int, k: int, block: int = DEFAULT_BLOCK) -> bool:
  """Whether the blocked path is used: enough blocks that the candidates are few."""
  return length // block >= 4 * k


def block_top_k(scores: jax.Array, k: int, block: int = DEFAULT_BLOCK,
                valid: Optional[jax.Array] = None) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(scores, k)` computed through block maxima (same values and indices).

  Args:
    scores: `[..., M]`, any float dtype.
    k: results per row, 1 <= k <= M.
    block: entries per block.
    valid: optional bool, broadcastable to `scores` (e.g. `[b, 1, 1, M]`): entries
      where False count as -inf. Applied inside the block maxima and to the
      candidates, so the caller needs no masked copy of the whole score matrix
      (that copy costs as much as the matmul that made the scores).
  Returns:
    `(values [..., k], indices [..., k] int32)`, best first: those of
    `lax.top_k(where(valid, scores, -inf), k)`.
  """
  length = scores.shape[-1]
  if not 1 <= k <= length:
    raise ValueError(f'k = {k} must be in [1, {length}]')
  num_blocks = -(-length // block)
  if num_blocks < k:
    if valid is not None:
      scores = jnp.where(valid, scores, -jnp.inf)
    values, indices = jax.lax.top_k(scores, k)
    return values, indices.astype(jnp.int32)
  pad = num_blocks * block - length
  if valid is None:
    valid = jnp.ones((1,) * scores.ndim, bool)
  valid = jnp.asarray(valid, bool)
  valid = jnp.broadcast_to(valid, valid.shape[:-1] + (length,))
  if pad:
    # Padded entries come after every real one in the (value, -index) order.
    widen = lambda a, fill: jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)],
                                    constant_values=fill)
    scores, valid = widen(scores, -jnp.inf), widen(valid, False)
  blocked = scores.reshape(scores.shape[:-1] + (num_blocks, block))    # [..., B, block]
  blocked_valid = valid.reshape(valid.shape[:-1] + (num_blocks, block))
  # A masked reduction is slower than a plain one, and a memory is mostly full: take the
  # plain maxima when every entry is valid (a scalar test; one branch runs).
  maxima = jax.lax.cond(
      blocked_valid.all(), lambda: blocked.max(axis=-1),
      lambda: jnp.where(blocked_valid, blocked, -jnp.inf).max(axis=-1))
  _, best_blocks = jax.lax.top_k(maxima, k)                            # [..., k]
  best_blocks = jnp.sort(best_blocks, axis=-1)                         # index order for ties
  candidates = jnp.take_along_axis(blocked, best_blocks[..., None], axis=-2)  # [..., k, block]
  candidates_valid = jnp.take_along_axis(blocked_valid, best_blocks[..., None], axis=-2)
  flat = jnp.where(candidates_valid, candidates, -jnp.inf)
  flat = flat.reshape(flat.shape[:-2] + (k * block,))
  values, where = jax.lax.top_k(flat, k)
  slots = best_blocks[..., None] * block + jnp.arange(block, dtype=best_blocks.dtype)
  indices = jnp.take_along_axis(slots.reshape(flat.shape), where, axis=-1)
  return values, indices.astype(jnp.int32)

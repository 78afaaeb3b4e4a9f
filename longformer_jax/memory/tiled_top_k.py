"""Exact top-k retrieval from a long memory without its score matrix.

`retrieve` on a memory of M entries scores every (query, entry) pair: a
`[b, h, q, M]` float32 matrix, 2.1 GB for 16 rows of 128 queries, 4 heads and
M = 65,536, written once and read twice, whatever part of the memory is
filled. Here the memory is read in tiles of `TILE` entries, only up to its
last filled tile, and only maxima leave a tile:

  1. per tile, the scores `[b, h, TILE, q]` and their maxima over
     sub-blocks of `SUB_BLOCK` entries (invalid entries count as -inf) and
     over blocks of `BLOCK` sub-blocks; tiles past the last valid slot of
     every row are not read at all (a memory filling from empty is read only
     as far as it is filled);
  2. the k blocks with the best maxima, then among their k * BLOCK
     sub-blocks the k with the best maxima (`lax.top_k` each time, the
     candidates in index order, so ties go to the lower index);
  3. the keys of those k sub-blocks, gathered and scored again, `[b, h, q,
     k * SUB_BLOCK]`, and their top-k.

Each choice keeps the top-k: a block's (sub-block's) maximum is at least each
of its entries, so an entry beaten by k block maxima is beaten by k entries.
Step 3 thus returns the top-k of all the scores: the same entries as
`lax.top_k` over the masked matrix, up to the rounding of the dot products
(step 3 sums its products in another order than step 1, so two entries whose
scores differ in the last bit may rank either way).
"""

import jax
import jax.numpy as jnp

TILE = 2048       # entries scored together
SUB_BLOCK = 8     # entries per sub-block maximum
BLOCK = 64        # sub-blocks per block maximum


def worth_tiling(capacity: int, k: int) -> bool:
  """Whether the tiled path is used: whole tiles, and more blocks than the top-k."""
  return capacity % TILE == 0 and capacity >= 2 * TILE and capacity // (SUB_BLOCK * BLOCK) > k


def filled_tiles(valid: jax.Array) -> jax.Array:
  """Scalar int32: tiles up to the last valid slot of any row (`valid [b, M]`)."""
  slots = jnp.arange(valid.shape[1], dtype=jnp.int32)
  last = jnp.max(jnp.where(valid, slots[None, :], -1))
  return (last + TILE) // TILE


def _maxima(keys: jax.Array, valid: jax.Array, queries: jax.Array, scale, tiles) -> tuple:
  """Maxima of the masked scores over sub-blocks `[b, h, q, M / SUB_BLOCK]` and over
  blocks `[b, h, q, M / (SUB_BLOCK * BLOCK)]`, read tile by tile (step 1)."""
  b, capacity, h, d = keys.shape
  q = queries.shape[1]
  per_tile = TILE // SUB_BLOCK

  def tile_maxima(tile, both):
    maxima, block_maxima = both
    start = tile * TILE
    tile_keys = jax.lax.dynamic_slice_in_dim(keys, start, TILE, axis=1)     # [b, T, h, d]
    tile_valid = jax.lax.dynamic_slice_in_dim(valid, start, TILE, axis=1)   # [b, T]
    # Entries as the matmul's rows (the faster layout on a CPU: many rows, q columns).
    scores = jnp.einsum('bmhd,bqhd->bhmq', tile_keys, queries,
                        preferred_element_type=jnp.float32) * scale       # [b, h, T, q]
    scores = jnp.where(tile_valid[:, None, :, None], scores, -jnp.inf)
    best = scores.reshape(b, h, per_tile, SUB_BLOCK, q).max(axis=3)
    blocks = best.reshape(b, h, per_tile // BLOCK, BLOCK, q).max(axis=3)
    return (jax.lax.dynamic_update_slice_in_dim(maxima, best, tile * per_tile, axis=2),
            jax.lax.dynamic_update_slice_in_dim(block_maxima, blocks,
                                                tile * (per_tile // BLOCK), axis=2))

  empty = lambda n: jnp.full((b, h, n, q), -jnp.inf, jnp.float32)
  maxima, block_maxima = jax.lax.fori_loop(
      0, tiles, tile_maxima,
      (empty(capacity // SUB_BLOCK), empty(capacity // (SUB_BLOCK * BLOCK))))
  return jnp.swapaxes(maxima, 2, 3), jnp.swapaxes(block_maxima, 2, 3)


def _in_index_order(maxima: jax.Array, k: int) -> jax.Array:
  """`[..., k]` indices of the k best of `maxima [..., n]`, sorted by index."""
  return jnp.sort(jax.lax.top_k(maxima, k)[1], axis=-1)


def tiled_top_k(keys: jax.Array, valid: jax.Array, queries: jax.Array, k: int,
                scale=None, tiles=None) -> tuple[jax.Array, jax.Array]:
  """Each query's top-k memory entries per head by (scaled) dot product.

  Args:
    keys: `[b, M, h, d]` the memory's keys (M a multiple of `TILE`).
    valid: `[b, M]` bool; invalid entries score -inf.
    queries: `[b, q, h, d]`.
    k: results per (query, head), `k * 4 <= M / SUB_BLOCK`.
    scale: multiplies the dot products (None: 1).
    tiles: the tiles to read, `filled_tiles(valid)` where the caller has it (None: computed).
  Returns:
    `(values [b, h, q, k] float32, indices [b, h, q, k] int32)`, best first, as
    `lax.top_k(where(valid, scores, -inf), k)` gives them (see the module's note on
    rounding).
  """
  b, capacity, h, d = keys.shape
  if not worth_tiling(capacity, k):
    raise ValueError(f'tiled top-k needs M a multiple of {TILE}, at least {2 * TILE} and '
                     f'{4 * k * SUB_BLOCK}; got M = {capacity}, k = {k}')
  scale = jnp.float32(1.0 if scale is None else scale)
  # Only indices leave this function: no gradient flows through the search.
  keys, queries = jax.lax.stop_gradient(keys), jax.lax.stop_gradient(queries)
  tiles = filled_tiles(valid) if tiles is None else tiles
  maxima, block_maxima = _maxima(keys, valid, queries, scale, tiles)
  q = queries.shape[1]
  # Step 2: the best k blocks, then the best k of their sub-blocks.
  blocks = _in_index_order(block_maxima, k)                            # [b, h, q, k]
  in_blocks = jnp.take_along_axis(maxima.reshape(b, h, q, -1, BLOCK), blocks[..., None],
                                  axis=3).reshape(b, h, q, k * BLOCK)
  picked = _in_index_order(in_blocks, k)                               # [b, h, q, k]
  chosen = jnp.take_along_axis(blocks, picked // BLOCK, axis=-1) * BLOCK + picked % BLOCK
  # Step 3: the chosen sub-blocks' keys [b, h, q, k, SUB_BLOCK, d] and validity.
  blocked_keys = keys.reshape(b, capacity // SUB_BLOCK, SUB_BLOCK, h, d)
  rows = jnp.arange(b)[:, None, None, None]
  heads = jnp.arange(h)[None, :, None, None]
  candidates = blocked_keys[rows, chosen, :, heads, :]                # [b, h, q, k, S, d]
  candidates_valid = valid.reshape(b, capacity // SUB_BLOCK, SUB_BLOCK)[rows, chosen]
  scores = jnp.einsum('bqhd,bhqksd->bhqks', queries, candidates,
                      preferred_element_type=jnp.float32) * scale
  scores = jnp.where(candidates_valid, scores, -jnp.inf).reshape(b, h, -1, k * SUB_BLOCK)
  values, where = jax.lax.top_k(scores, k)
  slots = (chosen[..., None] * SUB_BLOCK + jnp.arange(SUB_BLOCK, dtype=jnp.int32))
  indices = jnp.take_along_axis(slots.reshape(scores.shape), where, axis=-1)
  return values, indices.astype(jnp.int32)

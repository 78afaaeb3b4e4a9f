"""Block-sparse attention pieces shared by the Sparse Transformer and BigBird.

A chunk of `n` tokens is padded to `num_blocks * block` slots and viewed as
`[batch, num_blocks, block, ...]`. Each query block attends to a few *key
sets* (its neighbour blocks, gathered blocks, gathered tokens) instead of the
whole chunk, so the work is O(n * keys per query), never O(n^2). Every key set
carries the positions, documents and valid bits of its keys, and its mask is
computed from those positions (docs/design.md, contract 2); the key sets of one
query are disjoint, and one softmax runs over their concatenation, so the
result equals dense attention under the union mask.

The blocked layout assumes consecutive positions within the chunk (slot t of
a row holds position `positions[:, 0] + t`), as the stream batcher produces;
padded slots are invalid keys and their queries are dropped.
"""

import itertools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from longformer_jax.attention.core.dot_product import masked_softmax


class BlockedContext(NamedTuple):
  """Per-slot facts of a chunk padded to whole blocks, each `[batch, num_blocks * block]`.

  `rel` is the position relative to the chunk's first token (padded slots
  continue the count), `segments` the document ids, `valid` the real tokens.
  """
  rel: jax.Array
  segments: jax.Array
  valid: jax.Array


class KeySet(NamedTuple):
  """The keys one group of queries sees, laid out per query block.

  logits: `[batch, heads, num_blocks, block, keys]` scores of the queries.
  mask: `[batch, num_blocks, block, keys]` bool (the same for every head).
  weigh: the weighted sum of this set's values, weights
    `[batch, heads, num_blocks, block, keys] -> [batch, num_blocks, block, heads, head_dim]`.
  """
  logits: jax.Array
  mask: jax.Array
  weigh: Callable[[jax.Array], jax.Array]


def num_blocks_for(length: int, block: int) -> int:
  return -(-length // block)


def pad_length(x: jax.Array, padded_length: int, value=0) -> jax.Array:
  """Pads axis 1 of `x [batch, length, ...]` to `padded_length` with `value`."""
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, padded_length - x.shape[1])
  return jnp.pad(x, pad, constant_values=value)


def blocked_context(positions: jax.Array, segment_ids: jax.Array, valid: jax.Array,
                    block: int) -> BlockedContext:
  """`[batch, n]` position facts -> a `BlockedContext` padded to whole blocks."""
  n = positions.shape[1]
  padded = num_blocks_for(n, block) * block
  rel = positions - positions[:, :1]
  rel = jnp.concatenate([rel, rel[:, -1:] + 1 + jnp.arange(padded - n, dtype=rel.dtype)], axis=1)
  return BlockedContext(rel=rel, segments=pad_length(segment_ids, padded, -1),
                        valid=pad_length(valid, padded, False))


def to_blocks(x: jax.Array, block: int) -> jax.Array:
  """`[batch, num_blocks * block, ...] -> [batch, num_blocks, block, ...]`."""
  return x.reshape(x.shape[0], x.shape[1] // block, block, *x.shape[2:])


def from_blocks(x: jax.Array) -> jax.Array:
  """`[batch, num_blocks, block, ...] -> [batch, num_blocks * block, ...]`."""
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def neighbour_blocks(blocks: jax.Array, offsets: Sequence[int], fill=0) -> jax.Array:
  """Block I's neighbours I + o for each offset o, concatenated along the slot axis.

  Args:
    blocks: `[batch, num_blocks, block, ...]`.
    offsets: block offsets, e.g. `(-1, 0)`; neighbours outside the chunk are `fill`.
  Returns:
    `[batch, num_blocks, len(offsets) * block, ...]`.
  """
  before = max(0, -min(offsets))
  after = max(0, max(offsets))
  pad = [(0, 0)] * blocks.ndim
  pad[1] = (before, after)
  padded = jnp.pad(blocks, pad, constant_values=fill)
  nb = blocks.shape[1]
  return jnp.concatenate([padded[:, before + o:before + o + nb] for o in offsets], axis=2)


def document_mask(q_segments: jax.Array, k_segments: jax.Array, k_valid: jax.Array) -> jax.Array:
  """Same document and a real key; arguments broadcast against each other."""
  return (q_segments == k_segments) & k_valid


def attend_key_sets(key_sets: Sequence[KeySet], dtype) -> jax.Array:
  """One softmax over the concatenated (disjoint) key sets.

  Returns `[batch, num_blocks, block, heads, head_dim]`; a query with no
  allowed key gets zeros (masked_softmax).
  """
  logits = jnp.concatenate([s.logits for s in key_sets], axis=-1)
  mask = jnp.concatenate([s.mask for s in key_sets], axis=-1)
  weights = masked_softmax(logits, mask).astype(dtype)
  boundaries = list(itertools.accumulate(s.logits.shape[-1] for s in key_sets))[:-1]
  splits = jnp.split(weights, boundaries, axis=-1)
  return sum(s.weigh(w) for s, w in zip(key_sets, splits))


def neighbour_key_set(q_blocks: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array,
                      context: BlockedContext, block: int, offsets: Sequence[int],
                      allows: Callable[[jax.Array, jax.Array], jax.Array]) -> KeySet:
  """Each query block attends to the blocks at `offsets` from it.

  Args:
    q_blocks, k_blocks, v_blocks: `[batch, num_blocks, block, heads, head_dim]`.
    allows: `(q_rel, k_rel) -> bool`, the pattern's rule on relative positions
      (broadcasting), on top of same-document and valid-key.
  """
  rel = to_blocks(context.rel, block)
  k_rel = neighbour_blocks(rel, offsets, fill=-1)
  k_seg = neighbour_blocks(to_blocks(context.segments, block), offsets, fill=-1)
  k_valid = neighbour_blocks(to_blocks(context.valid, block), offsets, fill=False)
  keys = neighbour_blocks(k_blocks, offsets)
  values = neighbour_blocks(v_blocks, offsets)
  q_seg = to_blocks(context.segments, block)
  mask = (document_mask(q_seg[..., :, None], k_seg[..., None, :], k_valid[..., None, :])
          & allows(rel[..., :, None], k_rel[..., None, :]))
  logits = jnp.einsum('bnqhd,bnkhd->bhnqk', q_blocks, keys)
  return KeySet(logits, mask, lambda w: jnp.einsum('bhnqk,bnkhd->bnqhd', w, values))


def gathered_key_set(q_blocks: jax.Array, keys: jax.Array, values: jax.Array,
                     k_rel: jax.Array, k_seg: jax.Array, k_valid: jax.Array,
                     context: BlockedContext, block: int,
                     allows: Callable[[jax.Array, jax.Array], jax.Array]) -> KeySet:
  """Every query attends to the same gathered keys (summary columns, global tokens).

  Args:
    q_blocks: `[batch, num_blocks, block, heads, head_dim]`.
    keys, values: `[batch, k, heads, head_dim]`; `k_rel`, `k_seg`, `k_valid`: `[batch, k]`.
  """
  rel = to_blocks(context.rel, block)
  q_seg = to_blocks(context.segments, block)
  mask = (document_mask(q_seg[..., None], k_seg[:, None, None, :], k_valid[:, None, None, :])
          & allows(rel[..., None], k_rel[:, None, None, :]))
  logits = jnp.einsum('bnqhd,bkhd->bhnqk', q_blocks, keys)
  return KeySet(logits, mask, lambda w: jnp.einsum('bhnqk,bkhd->bnqhd', w, values))


def gathered_blocks_key_set(q_blocks: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array,
                            context: BlockedContext, block: int, block_index: jax.Array,
                            allows: Callable[[jax.Array, jax.Array], jax.Array]) -> KeySet:
  """Query block I attends to the key blocks `block_index[I]` (e.g. BigBird's random blocks).

  Args:
    q_blocks, k_blocks, v_blocks: `[batch, num_blocks, block, heads, head_dim]`.
    block_index: `[num_blocks, m]` int32 key-block indices in range, the same for every row.
    allows: `(q_rel, k_rel) -> bool` on top of same-document and valid-key.
  """
  b, nb = k_blocks.shape[:2]
  gather = lambda a: a[:, block_index].reshape(b, nb, -1, *a.shape[3:])   # [b, nb, m * block, ...]
  rel, seg, valid = (to_blocks(a, block) for a in context)
  mask = (document_mask(seg[..., :, None], gather(seg)[..., None, :], gather(valid)[..., None, :])
          & allows(rel[..., :, None], gather(rel)[..., None, :]))
  keys, values = gather(k_blocks), gather(v_blocks)
  logits = jnp.einsum('bnqhd,bnkhd->bhnqk', q_blocks, keys)
  return KeySet(logits, mask, lambda w: jnp.einsum('bhnqk,bnkhd->bnqhd', w, values))

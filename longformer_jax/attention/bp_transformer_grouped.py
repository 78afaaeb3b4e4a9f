"""BP-Transformer's neighbour attention without a per-token gather: tokens grouped per level.

bp_transformer.py's graph gives token i, at level l, nodes that depend on i only
through floor((i + base) / 2^l): on the left hi_l - rank with
hi_l = ceil((i - k (2^l - 1)) / 2^l) (the recursion hi_l = ceil((hi_{l-1} - k) / 2)
unrolled, as ceil(ceil(a / 2) / 2) = ceil(a / 4)), so base = (2^l - 1)(1 - k); on
the right st_l + rank - 1 with st_l = floor((i + 1 + k (2^l - 1)) / 2^l) (the same
for floors, while B has not reached the chunk's end, after which no right node is
present), so base = 1 + k (2^l - 1); level 0's tokens i + o have base 0.

So the tokens of one level fall into groups of 2^l consecutive queries (shifted by
base) that share their k nodes. Each group's queries meet its nodes in one small
matmul, `[2^l, head_dim] x [head_dim, k]`, and its nodes are k shifted slices of
the level's keys (`[groups, k, heads, head_dim]`): the keys read per level are
n k / 2^l, not n k, and the backward pass is pads and sums where a gather's is a
scatter-add (docs/benchmarks.md times the three paths).

A block is a run of graph columns with one level and base: `Block(level, base,
deltas, start)` covers columns `start .. start + len(deltas) - 1`, column r reading
node floor((i + base) / 2^l) + deltas[r]. `column_blocks` reads them off the graph's
column order and checks each present entry against the graph's own node index.
A block of level l needs its queries padded by base (mod 2^l) so that a reshape
makes its groups; base mod 2^L, with L the coarsest level, satisfies every level
at once, so `plan` pads the queries once for all the left blocks and once for all
the right ones (and not at all for level 0), and lists the graph's columns in the
order the blocks produce them: the caller builds its mask in that order.
"""

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class Block(NamedTuple):
  """Graph columns `start ..` of one level: column r reads node
  floor((i + base) / 2^level) + deltas[r]."""
  level: int
  base: int
  deltas: tuple
  start: int


def column_blocks(level: np.ndarray, node: np.ndarray, present: np.ndarray, k: int,
                  causal: bool) -> list:
  """The graph's columns (bp_transformer.neighbour_graph's order) as `Block`s.

  Args:
    level, node, present: `[n, m]`, the graph's fields.
  Raises:
    AssertionError if a present entry's node differs from the closed form (module docstring).
  """
  n = level.shape[0]
  fine = tuple(range(-k, 1 if causal else k + 1))
  blocks = [Block(0, 0, fine, 0)]
  start = len(fine)
  levels = int(level.max())                 # the fine columns are always there
  ranks = tuple(range(1, k + 1))
  for lv in range(1, levels + 1):
    size = 2 ** lv
    blocks.append(Block(lv, (size - 1) * (1 - k), tuple(-r for r in ranks), start))
    start += k
    if not causal:
      blocks.append(Block(lv, 1 + k * (size - 1), tuple(r - 1 for r in ranks), start))
      start += k
  assert start == level.shape[1], (start, level.shape)
  i = np.arange(n)[:, None]
  for b in blocks:
    cols = slice(b.start, b.start + len(b.deltas))
    expected = (i + b.base) // 2 ** b.level + np.asarray(b.deltas)[None]
    ok = present[:, cols]
    assert (level[:, cols] == b.level).all(), 'a block mixes levels'
    assert (node[:, cols][ok] == expected[ok]).all(), f'level {b.level}: closed form differs'
  return blocks


class Alignment(NamedTuple):
  """Blocks whose queries share one padding: query i sits at slot i + pad of a `length`-slot
  run that every block's group size divides, so each block's groups are a reshape of it."""
  pad: int
  length: int
  blocks: tuple


class Plan(NamedTuple):
  """The grouped path's column order: `columns` (`[m]` numpy) lists the graph's columns as
  the alignments' blocks read them, each block's `start` counted in this order."""
  alignments: tuple
  columns: np.ndarray


def plan(blocks: Sequence[Block], n: int) -> Plan:
  """Sorts `blocks` by their padding. A block of level l needs pad = base (mod 2^l); with
  L the coarsest level, pad = base mod 2^L satisfies every level's congruence at once, so
  the left blocks of every level share one padding, and the right blocks another."""
  top = 2 ** max(b.level for b in blocks)
  by_pad = {}
  for block in blocks:
    by_pad.setdefault(block.base % top, []).append(block)
  alignments, columns, start = [], [], 0
  for pad, members in sorted(by_pad.items()):
    size = 2 ** max(b.level for b in members)
    placed = []
    for b in members:
      placed.append(b._replace(start=start))
      columns.extend(range(b.start, b.start + len(b.deltas)))
      start += len(b.deltas)
    alignments.append(Alignment(pad, -(-(n + pad) // size) * size, tuple(placed)))
  return Plan(tuple(alignments), np.asarray(columns))


def _aligned(x: jax.Array, alignment: Alignment) -> jax.Array:
  """`[batch, n, ...]` -> `[batch, length, ...]`, row i at slot i + pad, zeros elsewhere."""
  pad = [(0, 0)] * x.ndim
  pad[1] = (alignment.pad, alignment.length - x.shape[1] - alignment.pad)
  return jnp.pad(x, pad)


def _block_nodes(level_array: jax.Array, block: Block, alignment: Alignment) -> jax.Array:
  """`[batch, count, heads, head_dim]` level array -> `[batch, groups, R, heads, head_dim]`:
  group g of the aligned run (slots g 2^l ..) reads node g + (base - pad) / 2^l + deltas[r];
  zeros outside the level (those columns are masked)."""
  size = 2 ** block.level
  groups, first = alignment.length // size, (block.base - alignment.pad) // size
  count = level_array.shape[1]
  lo = first + min(block.deltas)
  hi = first + groups - 1 + max(block.deltas)
  below, above = max(0, -lo), max(0, hi - (count - 1))
  pad = [(0, 0)] * level_array.ndim
  pad[1] = (below, above)
  padded = jnp.pad(level_array, pad)
  shifted = [padded[:, first + d + below:first + d + below + groups] for d in block.deltas]
  return jnp.stack(shifted, axis=2)


def _groups(x: jax.Array, level: int) -> jax.Array:
  """`[batch, length, ...]` -> `[batch, length / 2^level, 2^level, ...]` (a reshape)."""
  return x.reshape(x.shape[0], x.shape[1] // 2 ** level, 2 ** level, *x.shape[2:])


def _runs(x: jax.Array) -> jax.Array:
  """`_groups`' inverse."""
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def grouped_logits(q: jax.Array, level_keys: Sequence[jax.Array], plan: Plan) -> jax.Array:
  """q_i . k_u for every graph column in `plan.columns` order: `[batch, n, heads, m]`.

  Args:
    q: `[batch, n, heads, head_dim]`.
    level_keys: per level l, `[batch, count_l, heads, head_dim]` (level 0: the tokens).
  """
  n = q.shape[1]
  parts = []
  for alignment in plan.alignments:
    q_run = _aligned(q, alignment)
    logits = [_runs(jnp.einsum('bgshd,bgrhd->bgshr', _groups(q_run, b.level),
                               _block_nodes(level_keys[b.level], b, alignment)))
              for b in alignment.blocks]
    parts.append(jnp.concatenate(logits, axis=-1)[:, alignment.pad:alignment.pad + n])
  return jnp.concatenate(parts, axis=-1)


def grouped_values(weights: jax.Array, level_values: Sequence[jax.Array], plan: Plan
                   ) -> jax.Array:
  """sum_u w[i, u] v_u: `weights [batch, n, heads, m]` (`plan.columns` order) ->
  `[batch, n, heads, head_dim]`."""
  n = weights.shape[1]
  out = 0.0
  for alignment in plan.alignments:
    first = alignment.blocks[0].start
    last = alignment.blocks[-1].start + len(alignment.blocks[-1].deltas)
    w_run = _aligned(weights[..., first:last], alignment)
    mixed = 0.0
    for b in alignment.blocks:
      w = _groups(w_run[..., b.start - first:b.start - first + len(b.deltas)], b.level)
      nodes = _block_nodes(level_values[b.level], b, alignment)
      mixed = mixed + _runs(jnp.einsum('bgshr,bgrhd->bgshd', w, nodes))
    out = out + mixed[:, alignment.pad:alignment.pad + n]
  return out

"""The static block tables of the Pallas block-sparse kernel (`block_sparse_flash.py`).

A rule on slot ids (splash_kernels' rules) is evaluated once, in numpy, when the
kernel is traced, into:

- `BlockTables`: for each query block (`block_q` slots) the key blocks
  (`block_k` slots, block_q a multiple of block_k) it touches (and the
  transpose), each with the id of its tile's element mask in a small table of
  distinct partial masks `[block_q, block_k]` (id 0 is the whole tile). Whole
  tiles come first in each row, so the kernel visits them without loading a
  mask.
- `ProgramTable`: the work of one side split into programs. A row with more
  visits than `max_visits` (BigBird's global key blocks, which every query
  block visits) becomes several programs whose partial results are merged
  afterwards, so one long row is not the critical path of the whole kernel.
"""

import dataclasses
import functools
from typing import Optional

import jax.numpy as jnp
import numpy as np

MAX_PARTIAL_MASKS = 4096


@dataclasses.dataclass(frozen=True)
class BlockTables:
  """Which key blocks each query block visits (and the transpose), as int32 numpy arrays.

  Query blocks are `bq` slots and key blocks `bk` (`bq` a multiple of `bk`). kv_index,
  kv_mask `[nq, max_k]`: key block and partial-mask id of visit t of query block i
  (`kv_count[i]` visits, the first `kv_full[i]` of them whole tiles); q_index, q_mask
  `[nk, max_q]`, `q_count [nk]`, `q_full [nk]`: the same seen from key block j; masks
  `[num, bq, bk]` int8 (id 0: the whole tile).
  """
  kv_index: np.ndarray
  kv_mask: np.ndarray
  kv_count: np.ndarray
  kv_full: np.ndarray
  q_index: np.ndarray
  q_mask: np.ndarray
  q_count: np.ndarray
  q_full: np.ndarray
  masks: np.ndarray

  @property
  def kept_fraction(self) -> float:
    """The fraction of (query block, key block) tiles visited."""
    return float(self.kv_count.sum()) / (self.kv_index.shape[0] * self.q_index.shape[0])


@functools.lru_cache(maxsize=64)
def block_tables(rule, length: int, block_q: int, block_k: Optional[int] = None) -> BlockTables:
  """`rule.allows` on slot ids of a `length`-slot chunk, classified tile by tile: query
  blocks of `block_q` slots against key blocks of `block_k` (None: `block_q`). A tile is
  visited when any of its elements is allowed (so a query block of m = block_q / block_k
  sub-blocks visits the union of their key blocks), and is whole only when all are."""
  block_k = block_q if block_k is None else block_k
  nq, nk = length // block_q, length // block_k
  ids = np.arange(length)
  whole = np.ones((block_q, block_k), bool)
  distinct = {whole.tobytes(): 0}
  masks = [whole]
  visits_q = [[] for _ in range(nq)]
  visits_k = [[] for _ in range(nk)]
  for i in range(nq):
    q_ids = ids[i * block_q:(i + 1) * block_q, None]
    allowed_row = np.asarray(rule.allows(q_ids, ids[None, :]), bool)     # [block_q, length]
    for j in range(nk):
      piece = allowed_row[:, j * block_k:(j + 1) * block_k]
      if not piece.any():
        continue
      key = piece.tobytes()
      if key not in distinct:
        distinct[key] = len(masks)
        masks.append(piece.copy())
        if len(masks) > MAX_PARTIAL_MASKS:
          raise ValueError(f'{rule} has more than {MAX_PARTIAL_MASKS} distinct partial tiles '
                           f'of {block_q} x {block_k} slots')
      visits_q[i].append((j, distinct[key]))
      visits_k[j].append((i, distinct[key]))

  def table(visits):
    width = max(1, max(len(v) for v in visits))
    index = np.zeros((len(visits), width), np.int32)
    mask = np.zeros((len(visits), width), np.int32)
    for row, v in enumerate(visits):
      ordered = sorted(v, key=lambda visit: visit[1] != 0)     # whole tiles first, stable
      for t, (other, mask_id) in enumerate(ordered):
        index[row, t], mask[row, t] = other, mask_id
    count = np.array([len(v) for v in visits], np.int32)
    full = np.array([sum(mask_id == 0 for _, mask_id in v) for v in visits], np.int32)
    return index, mask, count, full

  return BlockTables(*table(visits_q), *table(visits_k), np.stack(masks).astype(np.int8))


@dataclasses.dataclass(frozen=True)
class ProgramTable:
  """One side's work as programs: program p works on block `row[p]` and visits `count[p]`
  blocks of the other side, `index[p, t]` with mask id `mask[p, t]`, the first `full[p]`
  of them whole. `split`: some row has several programs (results merged by row)."""
  row: np.ndarray
  index: np.ndarray
  mask: np.ndarray
  count: np.ndarray
  full: np.ndarray
  split: bool

  @property
  def num_programs(self) -> int:
    return int(self.row.shape[0])


def program_table(index: np.ndarray, mask: np.ndarray, count: np.ndarray, full: np.ndarray,
                  max_visits: Optional[int], split_over_mean: float) -> ProgramTable:
  """Splits the rows of more than `max_visits` visits into programs of at most that many
  (None: one program per row), but only where the longest row has more than
  `split_over_mean` x the mean visits: a long tail such as BigBird's global key blocks,
  not an even load, since the split rows' results are merged after the kernel.

  Programs 0 .. rows - 1 are the rows' first programs, in row order (their results lie
  where the unsplit kernel's would); the rest, after them, are the split rows' others.
  """
  nb = index.shape[0]
  longest = int(count.max())
  if (max_visits is None or longest <= max_visits
      or longest <= split_over_mean * float(count.mean())):
    return ProgramTable(np.arange(nb, dtype=np.int32), index, mask, count, full, False)
  firsts = [(i, 0) for i in range(nb)]
  others = [(i, start) for i in range(nb) for start in range(max_visits, int(count[i]),
                                                             max_visits)]
  num = len(firsts) + len(others)
  out_index = np.zeros((num, max_visits), np.int32)
  out_mask = np.zeros((num, max_visits), np.int32)
  out_count = np.zeros(num, np.int32)
  out_full = np.zeros(num, np.int32)
  for p, (i, start) in enumerate(firsts + others):
    stop = min(int(count[i]), start + max_visits)
    out_index[p, :stop - start] = index[i, start:stop]
    out_mask[p, :stop - start] = mask[i, start:stop]
    out_count[p] = stop - start
    out_full[p] = min(max(int(full[i]) - start, 0), stop - start)
  rows = np.array([i for i, _ in firsts + others], np.int32)
  return ProgramTable(rows, out_index, out_mask, out_count, out_full, True)


def device_arrays(table: ProgramTable, masks: np.ndarray) -> tuple:
  """(row, index, mask, count, full, masks) as jnp arrays, each dimension padded to a
  power of two (Triton loads whole power-of-two blocks)."""
  def pad(a):
    shape = tuple(1 << max(0, int(d - 1).bit_length()) for d in a.shape)
    out = np.zeros(shape, a.dtype)
    out[tuple(slice(0, d) for d in a.shape)] = a
    return jnp.asarray(out)
  return tuple(pad(a) for a in (table.row, table.index, table.mask, table.count, table.full,
                                masks))

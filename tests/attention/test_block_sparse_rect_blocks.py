"""The Pallas block-sparse kernel with query blocks larger than key blocks (block_q = m * block_k).

In interpret mode, as tests/attention/test_block_sparse_flash.py (whose square tests
these mirror): outputs and gradients w.r.t. q, k, v equal the dense float32
masked softmax to 1e-5, on the splash tests' inputs (documents starting inside
the chunk, padding, queries with no key that must give 0) at a chunk of 200,
not a multiple of block_q (padded to 224 or 256), for block_q = 2 x block_k
(blocks of 32 x 16; one case 4x, 64 x 16):

- the Sparse Transformer's strided pattern (merged) and fixed pattern
  (multihead: one rule per head), a two-sided window (no rule: `left`, `right`),
  BigBird's blocks (window, global and random blocks, causal);
- each with one program a row and with rows split over programs of at most 2
  visits (merged by log-sum-exp, gradients summed);
- the program table of a rectangular tiling on a small strided pattern: m times
  fewer forward programs, each walking the union of its m sub-blocks' key blocks
  (brute force from the dense mask and from the square tables), the tile masks,
  the transposed table, and fewer key-block loads than the square tiling;
- tunings that Triton cannot take raise a ValueError naming the field.
"""

import numpy as np
import pytest

from longformer_jax.attention.bigbird import splash as bigbird_splash
from longformer_jax.attention.core import block_sparse_flash, block_sparse_tables
from longformer_jax.attention.sparse_transformer import splash as sparse_splash
from tests.support.bigbird_loop_reference import BB, bigbird_loop, random_table
from tests.support.bigbird_loop_reference import reference_mask as loop_reference_mask
from tests.support.splash_mask_reference import SUMMARY, STRIDE, compare, compare_with_mask

Tuning = block_sparse_flash.KernelTuning
RECT = Tuning(block_q=32, block_k=16)
# Every row past the first few split into programs of at most 2 visits.
RECT_SPLIT = Tuning(block_q=32, block_k=16, max_visits=2, split_over_mean=0.0)
TUNINGS = pytest.mark.parametrize('tuning', [RECT, RECT_SPLIT],
                                  ids=['one_program_a_row', 'split'])
CHUNK = 200


def kernel(rules, tuning, **window):
  return lambda q, k, v, seg, valid: block_sparse_flash.block_sparse_attention(
      q, k, v, seg, valid, mask=rules, tuning=tuning, **window)    # interpret mode off a GPU


@TUNINGS
def test_strided_merged_equals_dense_reference(tuning):
  rules = sparse_splash.pattern_rules('strided', 'merged', STRIDE, SUMMARY, 2)
  compare(kernel(rules, tuning), ['strided'] * 2, chunk=CHUNK)


@pytest.mark.parametrize('tuning', [Tuning(block_q=64, block_k=16),
                                    Tuning(block_q=64, block_k=16, max_visits=2,
                                           split_over_mean=0.0)],
                         ids=['one_program_a_row', 'split'])
def test_strided_query_blocks_of_4_key_blocks(tuning):
  rules = sparse_splash.pattern_rules('strided', 'merged', STRIDE, SUMMARY, 1)
  compare(kernel(rules, tuning), ['strided'], chunk=CHUNK)


@TUNINGS
def test_fixed_multihead_equals_dense_reference(tuning):
  rules = sparse_splash.pattern_rules('fixed', 'multihead', STRIDE, SUMMARY, 2)
  compare(kernel(rules, tuning), ['fixed_local', 'fixed_summary'], chunk=CHUNK)


def test_two_sided_window_equals_dense_reference():
  compare(kernel(None, RECT_SPLIT, left=20, right=5), ['window_20_5'] * 2, chunk=CHUNK)


@TUNINGS
def test_bigbird_blocks_equal_dense_reference(tuning):
  chunk = 96                                    # 6 BigBird blocks of 16, 3 query blocks of 32
  table = random_table(chunk // BB['block'], causal=True)
  rule = bigbird_splash.BigBirdBlocks(causal=True, random=table, **BB)
  mask = loop_reference_mask(
      [lambda i, j: bigbird_loop(i, j, table, causal=True, **BB)], chunk)
  compare_with_mask(kernel(rule, tuning), mask, chunk)


def _visits(index, mask, count, row):
  return dict(zip(index[row, :count[row]].tolist(), mask[row, :count[row]].tolist()))


@pytest.mark.parametrize('m', [2, 4])
def test_rect_program_table_is_the_union_of_sub_blocks(m):
  length, block_k = 128, 16
  block_q = m * block_k
  rule = sparse_splash.pattern_rules('strided', 'merged', STRIDE, SUMMARY, 1)[0]
  rect = block_sparse_tables.block_tables(rule, length, block_q, block_k)
  square = block_sparse_tables.block_tables(rule, length, block_k)
  ids = np.arange(length)
  dense = np.asarray(rule.allows(ids[:, None], ids[None, :]), bool)
  nq, nk = length // block_q, length // block_k
  assert rect.masks.shape[1:] == (block_q, block_k)
  assert rect.kv_index.shape[0] == nq and rect.q_index.shape[0] == nk
  for i in range(nq):
    visited = _visits(rect.kv_index, rect.kv_mask, rect.kv_count, i)
    # Brute force: a key block is visited iff any of the block_q rows touches it ...
    tiles = {j: dense[i * block_q:(i + 1) * block_q, j * block_k:(j + 1) * block_k]
             for j in range(nk)}
    assert set(visited) == {j for j, tile in tiles.items() if tile.any()}
    # ... the union of the square table's visits of the m sub-blocks.
    union = set()
    for sub in range(i * m, (i + 1) * m):
      union |= set(_visits(square.kv_index, square.kv_mask, square.kv_count, sub))
    assert set(visited) == union
    for j, mask_id in visited.items():
      np.testing.assert_array_equal(rect.masks[mask_id] != 0, tiles[j])
      assert (mask_id == 0) == bool(tiles[j].all())         # whole only if all allowed
      assert _visits(rect.q_index, rect.q_mask, rect.q_count, j)[i] == mask_id
  for j in range(nk):                                        # the transpose has nothing else
    assert set(_visits(rect.q_index, rect.q_mask, rect.q_count, j)) == {
        i for i in range(nq) if j in _visits(rect.kv_index, rect.kv_mask, rect.kv_count, i)}
  # Whole tiles first in each row: the kernel visits the first `full` with no mask.
  for mask, count, full in ((rect.kv_mask, rect.kv_count, rect.kv_full),
                            (rect.q_mask, rect.q_count, rect.q_full)):
    for row in range(mask.shape[0]):
      assert (mask[row, :full[row]] == 0).all() and (mask[row, full[row]:count[row]] != 0).all()
  # m times fewer forward programs, and fewer loads of key blocks in all.
  programs = lambda t: block_sparse_tables.program_table(t.kv_index, t.kv_mask, t.kv_count,
                                                         t.kv_full, None, 4.0).num_programs
  assert programs(square) == m * programs(rect) == nk
  assert rect.kv_count.sum() < square.kv_count.sum()


def test_rect_rows_split_into_programs():
  """Split rows (max_visits) of a rectangular table: each row's visits, in order, once."""
  length, block_q, block_k = 128, 32, 16
  rule = sparse_splash.pattern_rules('strided', 'merged', STRIDE, SUMMARY, 1)[0]
  t = block_sparse_tables.block_tables(rule, length, block_q, block_k)
  for index, mask, count, full in ((t.kv_index, t.kv_mask, t.kv_count, t.kv_full),
                                   (t.q_index, t.q_mask, t.q_count, t.q_full)):
    programs = block_sparse_tables.program_table(index, mask, count, full, max_visits=2,
                                                 split_over_mean=0.0)
    assert programs.split
    rows = index.shape[0]
    np.testing.assert_array_equal(programs.row[:rows], np.arange(rows))    # firsts in place
    for row in range(rows):
      mine = np.flatnonzero(programs.row == row)
      assert len(mine) == max(1, -(-int(count[row]) // 2))
      joined = np.concatenate([programs.index[p, :programs.count[p]] for p in mine])
      np.testing.assert_array_equal(joined, index[row, :count[row]])
      assert programs.full[mine].sum() == full[row]


@pytest.mark.parametrize('fields,named', [
    (dict(block_q=96, block_k=32), 'block_q'),        # not a power of two
    (dict(block_q=32, block_k=64), 'block_q'),        # not a multiple of block_k
    (dict(block_q=64, block_k=8), 'block_k'),         # under 16
    (dict(block_q=64, block_k=24), 'block_k'),
])
def test_bad_tunings_name_the_field(fields, named):
  with pytest.raises(ValueError, match=f'KernelTuning.{named}:'):
    Tuning(**fields)

"""The Pallas block-sparse flash-attention kernel (attention/core/block_sparse_flash.py).

The kernel runs here in Pallas interpret mode (on a GPU, Triton compiles it: benchmarks/gpu_checks.sh).
It is held to the dense float32 masked softmax under masks built in the tests
from the papers' rules written independently of the code (the numpy rules of
tests/support/splash_mask_reference.py, the loops of tests/attention/test_splash_layers.py and
tests/support/bigbird_loop_reference.py): outputs and gradients
w.r.t. q, k, v to 1e-5, on the splash tests' inputs (positions from 1000,
documents starting inside the chunk, padding, queries with no key that must
give 0), at chunks that are not a multiple of the block:

- the Sparse Transformer's strided pattern (merged) and fixed pattern
  (multihead: two rules, one call per rule);
- BigBird's blocks (window, global and static random blocks, causal);
- the block tables visit exactly the blocks the rule keeps (brute force), and
  the strided pattern skips most of them at 1,024 slots.
"""

import numpy as np
import pytest

from longformer_jax.attention.core import block_sparse_flash, block_sparse_tables
from longformer_jax.attention.bigbird import splash as bigbird_splash
from longformer_jax.attention.sparse_transformer import splash as sparse_splash
from tests.support.bigbird_loop_reference import BB, bigbird_loop, random_table
from tests.support.bigbird_loop_reference import reference_mask as loop_reference_mask
from tests.support.splash_mask_reference import SUMMARY, STRIDE, compare, compare_with_mask

BLOCK = 16
TUNING = block_sparse_flash.KernelTuning(block_q=BLOCK, block_k=BLOCK)
# Rows of more than 2 visits split over several programs, merged by log-sum-exp (forward)
# and summed (gradients): every row of these tests' patterns past the first few.
SPLIT = block_sparse_flash.KernelTuning(block_q=BLOCK, block_k=BLOCK, max_visits=2,
                                        split_over_mean=0.0)
TUNINGS = pytest.mark.parametrize('tuning', [TUNING, SPLIT], ids=['one_program_a_row', 'split'])


def kernel(rules, tuning=TUNING):
  return lambda q, k, v, seg, valid: block_sparse_flash.block_sparse_attention(
      q, k, v, seg, valid, mask=rules, tuning=tuning)    # interpret mode off a GPU


@TUNINGS
def test_strided_merged_equals_dense_reference(tuning):
  rules = sparse_splash.pattern_rules('strided', 'merged', STRIDE, SUMMARY, 2)
  compare(kernel(rules, tuning), ['strided'] * 2, chunk=200)


def test_fixed_multihead_equals_dense_reference():
  rules = sparse_splash.pattern_rules('fixed', 'multihead', STRIDE, SUMMARY, 4)
  compare(kernel(rules), ['fixed_local'] * 2 + ['fixed_summary'] * 2, chunk=200)


@TUNINGS
def test_bigbird_blocks_equal_dense_reference(tuning):
  chunk = 96                                    # 6 BigBird blocks of 16
  table = random_table(chunk // BB['block'], causal=True)
  rule = bigbird_splash.BigBirdBlocks(causal=True, random=table, **BB)
  mask = loop_reference_mask(
      [lambda i, j: bigbird_loop(i, j, table, causal=True, **BB)], chunk)
  compare_with_mask(kernel(rule, tuning), mask, chunk)


@pytest.mark.parametrize('rule_name', ['strided', 'fixed', 'bigbird'])
def test_block_tables_visit_exactly_the_kept_blocks(rule_name):
  length, block = 128, 16
  if rule_name == 'bigbird':
    rule = bigbird_splash.BigBirdBlocks(causal=True, random=random_table(length // 16, True),
                                        **BB)
  else:
    rule = sparse_splash.pattern_rules(rule_name, 'merged', STRIDE, SUMMARY, 1)[0]
  tables = block_sparse_tables.block_tables(rule, length, block)
  ids = np.arange(length)
  dense = np.asarray(rule.allows(ids[:, None], ids[None, :]), bool)
  nb = length // block
  for i in range(nb):
    visited = {int(j): int(m) for j, m in zip(tables.kv_index[i, :tables.kv_count[i]],
                                               tables.kv_mask[i, :tables.kv_count[i]])}
    for j in range(nb):
      piece = dense[i * block:(i + 1) * block, j * block:(j + 1) * block]
      assert (j in visited) == bool(piece.any())
      if j in visited:
        np.testing.assert_array_equal(tables.masks[visited[j]] != 0, piece)
        transposed = dict(zip(tables.q_index[j, :tables.q_count[j]].tolist(),
                              tables.q_mask[j, :tables.q_count[j]].tolist()))
        assert transposed[i] == visited[j]
  # Whole blocks first: the kernel visits the first `full` of a row with no mask.
  for index, mask, count, full in ((tables.kv_index, tables.kv_mask, tables.kv_count,
                                    tables.kv_full),
                                   (tables.q_index, tables.q_mask, tables.q_count, tables.q_full)):
    for row in range(nb):
      ids_ = mask[row, :count[row]]
      assert (ids_[:full[row]] == 0).all() and (ids_[full[row]:] != 0).all()
    # Split into programs of at most 3 visits: each row's visits, in order, exactly once.
    programs = block_sparse_tables.program_table(index, mask, count, full, max_visits=3,
                                                      split_over_mean=0.0)
    assert programs.split == bool(count.max() > 3)
    np.testing.assert_array_equal(programs.row[:nb], np.arange(nb))    # firsts in place
    # An even load is not split: no row has more than 100x the mean.
    assert not block_sparse_tables.program_table(index, mask, count, full, 3, 100.0).split
    for row in range(nb):
      mine = np.flatnonzero(programs.row == row)
      assert len(mine) == max(1, -(-int(count[row]) // 3))
      assert (programs.count[mine] <= 3).all()
      joined = np.concatenate([programs.index[p, :programs.count[p]] for p in mine])
      np.testing.assert_array_equal(joined, index[row, :count[row]])
      assert programs.full[mine].sum() == full[row]
      for p in mine:
        ids_ = programs.mask[p, :programs.count[p]]
        assert (ids_[:programs.full[p]] == 0).all() and (ids_[programs.full[p]:] != 0).all()


def test_strided_pattern_skips_most_blocks():
  rule = sparse_splash.pattern_rules('strided', 'merged', 32, 1, 1)[0]
  tables = block_sparse_tables.block_tables(rule, 1024, 32)
  # Local: the diagonal block and the one before; summary: every block (one column each):
  # about 1/2 of the causal half, against all 32 x 32 blocks of dense attention.
  assert tables.kept_fraction < 0.6
  assert tables.masks.shape[0] <= 4            # a handful of distinct partial blocks


# ---- the layers with attention_backend='pallas_gpu' (interpret mode here) ----

def layer(kind):
  from longformer_jax.attention.bigbird.attention import BigBirdAttention, BigBirdConfig
  from longformer_jax.attention.image_local.attention import ImageLocalAttention, ImageLocalConfig
  from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
  from tests.support.tiny_models import shared_settings
  from longformer_jax.attention.sparse_transformer.attention import (SparseTransformerAttention,
                                                           SparseTransformerConfig)
  from longformer_jax.attention.vanilla.attention import VanillaAttention
  common = dict(num_heads=2, head_dim=16, d_model=32)
  return {
      'vanilla': lambda b: VanillaAttention(
          shared=shared_settings(causal=True, attention_backend=b, **common)),
      'longformer_dilated': lambda b: LongformerAttention(
          config=LongformerConfig(window=4, head_dilations='1,3', window_cache=False),
          shared=shared_settings(causal=False, attention_backend=b, **common)),
      'sparse_fixed_multihead': lambda b: SparseTransformerAttention(
          config=SparseTransformerConfig(pattern='fixed', stride=8, summary_len=2,
                                         integration='multihead'),
          shared=shared_settings(attention_backend=b, **common)),
      'bigbird': lambda b: BigBirdAttention(
          config=BigBirdConfig(block=16, window_blocks=1, random_blocks=2, global_blocks=1,
                               seed=3),
          shared=shared_settings(causal=True, attention_backend=b, **common), layer_index=1),
      'image_local_1d': lambda b: ImageLocalAttention(
          config=ImageLocalConfig(query_len=8, memory_len=8),
          shared=shared_settings(attention_backend=b, **common)),
      'image_local_1d_bidirectional': lambda b: ImageLocalAttention(
          config=ImageLocalConfig(query_len=8, memory_len=8),
          shared=shared_settings(causal=False, attention_backend=b, **common)),
  }[kind]


@pytest.mark.parametrize('kind', ['vanilla', 'longformer_dilated', 'sparse_fixed_multihead',
                                  'bigbird', 'image_local_1d',
                                  pytest.param('image_local_1d_bidirectional',
                                               marks=pytest.mark.slow)])
def test_layer_pallas_gpu_equals_xla(kind):
  """The whole layer with 'pallas_gpu' and 'xla' (same parameters): outputs and gradients
  w.r.t. parameters and inputs, documents mid-chunk and padding (chunk 40 or 96)."""
  from tests.support.backend_comparison import assert_trees_close, layer_outputs_and_grads
  results = layer_outputs_and_grads(layer(kind), chunk=96 if kind == 'bigbird' else 40,
                                    kernel='pallas_gpu')
  assert_trees_close(results['pallas_gpu'], results['xla'], atol=2e-5)


def test_pallas_gpu_backend_rules():
  from longformer_jax.attention.core import attention_backend as backends
  from longformer_jax.config.errors import ConfigError
  pattern = sparse_splash.kernel_pattern(type('M', (), dict(causal=True))(), type('S', (), dict(
      pattern='strided', stride=8, summary_len=1, integration='merged'))())
  for platform in ('gpu', 'cpu'):
    assert backends.resolve_backend('pallas_gpu', pattern, dtype='bfloat16', head_dim=64,
                                    platform=platform) == 'pallas_gpu'
  # auto picks it on a GPU in bfloat16 for the patterns measured there (Sparse Transformer,
  # BigBird), not in float32, nor for the Image Transformer's 1D blocks (not measured).
  bigbird_pattern = bigbird_splash.kernel_pattern(type('M', (), dict(causal=False))(),
                                          type('B', (), dict(max_global_tokens=0))())
  image_1d = backends.KernelPattern(right=0, dense_mask_ok=False, splash_only='1D blocks')
  for layer_pattern, dtype, platform, expected in [
      (pattern, 'bfloat16', 'gpu', 'pallas_gpu'), (bigbird_pattern, 'bfloat16', 'gpu', 'pallas_gpu'),
      (pattern, 'float32', 'gpu', 'xla'), (image_1d, 'bfloat16', 'gpu', 'xla'),
      (pattern, 'bfloat16', 'cpu', 'xla'), (pattern, 'bfloat16', 'tpu', 'splash')]:
    assert backends.resolve_backend('auto', layer_pattern, dtype=dtype, head_dim=64,
                                    platform=platform) == expected, (layer_pattern, dtype,
                                                                     platform)
  with pytest.raises(ConfigError, match='on TPU use splash'):
    backends.resolve_backend('pallas_gpu', pattern, dtype='bfloat16', head_dim=64,
                             platform='tpu')
  with_memory = backends.KernelPattern(in_chunk=False)
  with pytest.raises(ConfigError, match='memory before the chunk'):
    backends.resolve_backend('pallas_gpu', with_memory, dtype='bfloat16', head_dim=64,
                             platform='gpu')

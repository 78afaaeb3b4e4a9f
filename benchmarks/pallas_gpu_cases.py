"""The Pallas block-sparse kernel on a GPU, for attention_scaling.py (GPU only).

The Sparse Transformer and BigBird settings of `sparse_cases.py` (batch 1, 8
heads of 64, one document, about 512 keys per query) through
`block_sparse_flash.block_sparse_attention` (Triton), in bfloat16, beside
`cudnn_causal` (benchmarks/cudnn_cases.py): the issue's target is the kernel
within 2x of cuDNN's causal attention scaled by the fraction of blocks the
pattern keeps (`kept_fraction` of the block tables, printed by
`python -m benchmarks.pallas_gpu_cases --seq_len=N` on any machine).

- `pallas_sparse_strided`: causal strided, stride 512, blocks of 64.
- `pallas_bigbird`: BigBird's blocks of 64 (1 window block each side, 3
  random, 2 global; bidirectional), the sparse rows only (the global rows
  are an XLA einsum in the layer).

`flops(n)` counts the pattern's allowed pairs as in sparse_cases.py. On any
other backend this file has no cases.
"""

import argparse

import jax
import jax.numpy as jnp

from benchmarks.attention_case import AttentionCase
from benchmarks.sparse_cases import (BIGBIRD, HEAD_DIM, HEADS, STRIDED, attention_flops,
                                     bigbird_pairs, bigbird_pattern, sparse_pairs)
from longformer_jax.attention.core import block_sparse_flash
from longformer_jax.attention.bigbird import splash as bigbird_splash
from longformer_jax.attention.sparse_transformer import splash as sparse_splash

BLOCK = 64


def bf16_inputs(n: int, key: jax.Array) -> tuple:
  return tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM), jnp.bfloat16)
               for k in jax.random.split(key, 3))


def strided_rule():
  return sparse_splash.pattern_rules('strided', 'merged', STRIDED['stride'], 1, 1)[0]


def bigbird_rule(n: int):
  with jax.ensure_compile_time_eval():
    table = tuple(tuple(int(b) for b in row) for row in bigbird_pattern(n).tolist())
  return bigbird_splash.BigBirdBlocks(BIGBIRD['block'], BIGBIRD['window_blocks'],
                                      BIGBIRD['global_blocks'], False, table)


def forward_with(rule_for):
  def forward(q, k, v):
    n = q.shape[1]
    segments, valid = jnp.zeros((1, n), jnp.int32), jnp.ones((1, n), bool)
    return block_sparse_flash.block_sparse_attention(
        q * jnp.asarray(HEAD_DIM ** -0.5, q.dtype), k, v, segments, valid, mask=rule_for(n),
        tuning=block_sparse_flash.KernelTuning(block_q=BLOCK, block_k=BLOCK))
  return forward


CASES = [] if jax.default_backend() != 'gpu' else [
    AttentionCase('pallas_sparse_strided', bf16_inputs, forward_with(lambda n: strided_rule()),
                  lambda n: attention_flops(sparse_pairs(n, STRIDED))),
    AttentionCase('pallas_bigbird', bf16_inputs, forward_with(bigbird_rule),
                  lambda n: attention_flops(bigbird_pairs(n))),
]


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description='kept block fractions of the cases')
  parser.add_argument('--seq_len', type=int, default=16384)
  n = parser.parse_args().seq_len
  for name, rule in (('pallas_sparse_strided', strided_rule()), ('pallas_bigbird', bigbird_rule(n))):
    tables = block_sparse_flash.block_tables(rule, n, BLOCK)
    print(f'{name}: n={n} block={BLOCK} kept_fraction={tables.kept_fraction:.4f} '
          f'partial masks={tables.masks.shape[0]}')

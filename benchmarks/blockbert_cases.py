"""Attention-scaling cases for BlockBERT (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, no
padding, bidirectional (the paper's encoder). Blocks of 512 tokens, so that a
query attends to as many keys as a window of 512: b = n / 512 blocks, half the
heads with the identity permutation and half with the shift i -> (i - 1) mod b
(the paper's identity + shift). At n = 512 there is one block (full attention).

`blockbert_blocked` is the library's fast path (`blockbert_attention`, O(n^2 / b)
= O(512 n)); `blockbert_dense_mask` builds the n x n blockwise mask from the
same rule (M[i, j] = 1 iff blk(j) = pi(blk(i))) and runs dense masked
attention (skipped above 8k). `flops(n)`: 4 * head_dim FLOPs per allowed
(query, key) pair and head: n * 512 pairs per head.
"""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention import blockbert
from longformer_jax.attention.core.dot_product import attend

HEADS, HEAD_DIM = 8, 64
BLOCK = 512
DENSE_MAX_LEN = 8192


def make_qkv(n: int, key: jax.Array) -> tuple:
  """q, k, v: `[1, n, 8, 64]` float32."""
  return tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in jax.random.split(key, 3))


def permutations(n: int) -> str:
  """Identity and shift-by-one of b = ceil(n / 512) blocks, e.g. '0,1;1,0'."""
  b = max(1, -(-n // BLOCK))
  identity = ','.join(str(i) for i in range(b))
  shift = ','.join(str((i - 1) % b) for i in range(b))
  return f'{identity};{shift}'


def scaled(q: jax.Array) -> jax.Array:
  return q / jnp.sqrt(jnp.float32(HEAD_DIM))


def blocked(q, k, v):
  n = q.shape[1]
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  key_blocks = blockbert.key_block_maps(permutations(n), HEADS, causal=False)
  return blockbert.blockbert_attention(scaled(q), k, v, positions, jnp.zeros_like(positions),
                                       jnp.ones(positions.shape, bool), key_blocks, causal=False)


def dense_mask(q, k, v):
  """Dense attention under the `[heads, n, n]` blockwise mask."""
  n = q.shape[1]
  key_blocks = blockbert.key_block_maps(permutations(n), HEADS, causal=False)
  block = -(-n // key_blocks.shape[1])
  blk = jnp.arange(n) // block
  allowed = jnp.asarray(key_blocks)[:, blk][:, :, None] == blk[None, None, :]
  return attend(jnp.einsum('bqhd,bkhd->bhqk', scaled(q), k), allowed[None], v)


def pairs(n: int) -> int:
  """Allowed (query, key) pairs summed over heads: each query sees its key block's tokens."""
  key_blocks = blockbert.key_block_maps(permutations(n), HEADS, causal=False)
  block = -(-n // key_blocks.shape[1])
  sizes = np.minimum(block, n - np.arange(key_blocks.shape[1]) * block)    # tokens per block
  return int(sum(sizes[i] * sizes[key_blocks[h, i]] for h in range(HEADS)
                 for i in range(key_blocks.shape[1])))


flops = lambda n: 4.0 * HEAD_DIM * pairs(n)

CASES = [
    AttentionCase('blockbert_blocked', make_qkv, blocked, flops),
    AttentionCase('blockbert_dense_mask', make_qkv, dense_mask, flops,
                  max_seq_len=DENSE_MAX_LEN),
]

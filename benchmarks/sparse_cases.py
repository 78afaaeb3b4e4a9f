"""Attention-scaling cases for the Sparse Transformer and BigBird (benchmarks/attention_scaling.py).

Shapes as the Longformer sweep: batch 1, 8 heads of 64, one document, no
padding. Settings chosen so that a query attends to about as many keys as a
window of 512:

- `sparse_strided_*`: causal strided pattern, stride l = 512: the previous 512
  positions plus every 512-th one before them (n/512 more keys).
- `sparse_fixed_*`: causal fixed pattern, blocks of l = 512 with c = 32 summary
  positions each (c = l/16, as the paper's c = 8..32 for l = 128): the query's
  own block (256 keys on average) plus 32 summaries per earlier block.
- `bigbird_*`: bidirectional, blocks of 64, 3 window blocks + 3 random blocks
  + 2 global (ITC) blocks = 8 blocks = 512 keys per query (as Hugging Face's
  BigBird defaults), pattern from `pattern_key(0, 0)`.

`*_blocked` is the library's fast path; `*_dense_mask` builds the n x n mask
from the same rule and runs dense masked attention (skipped above 8k, where
dense runs out of memory on a 24 GiB machine). `flops(n)` counts the useful
work of the pattern, 4 * head_dim * heads FLOPs (q.k and p.v) per allowed
(query, key) pair, counted exactly; the dense-mask rows report the same
useful FLOPs, so their time over the floor shows the waste.

Quick check (each case once at one length, blocked vs dense-mask agreement):
  python -m benchmarks.sparse_cases --seq_len=1024
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase, quick_check
from longformer_jax.attention.bigbird import attention as bigbird
from longformer_jax.attention.sparse_transformer import attention as sparse_transformer
from longformer_jax.attention.core.block_sparse import num_blocks_for
from longformer_jax.attention.core.dot_product import attend

HEADS, HEAD_DIM = 8, 64
STRIDED = dict(pattern='strided', stride=512, summary_len=1)
FIXED = dict(pattern='fixed', stride=512, summary_len=32)
BIGBIRD = dict(block=64, window_blocks=1, random_blocks=3, global_blocks=2)
DENSE_MAX_LEN = 8192


def make_qkv(n: int, key: jax.Array) -> tuple:
  """q, k, v: `[1, n, 8, 64]` float32."""
  return tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in jax.random.split(key, 3))


def one_document(n: int):
  """positions, segment_ids, valid `[1, n]` of one unpadded document."""
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  return positions, jnp.zeros_like(positions), jnp.ones(positions.shape, bool)


def scaled(q: jax.Array) -> jax.Array:
  return q / jnp.sqrt(jnp.float32(HEAD_DIM))


def sparse_blocked(q, k, v, *, settings):
  return sparse_transformer.sparse_transformer_attention(scaled(q), k, v, *one_document(q.shape[1]),
                                                         **settings)


def sparse_allowed(n: int, settings) -> jax.Array:
  """`[1, n, n]` bool: the pattern's rule on every pair (dense mask)."""
  rel = jnp.arange(n)
  return sparse_transformer.pattern_allows(settings['pattern'], rel[:, None], rel[None, :],
                                           settings['stride'], settings['summary_len'])[None]


def sparse_dense_mask(q, k, v, *, settings):
  logits = jnp.einsum('bqhd,bkhd->bhqk', scaled(q), k)
  return attend(logits, sparse_allowed(q.shape[1], settings), v)


def sparse_pairs(n: int, settings) -> int:
  """Allowed (query, key) pairs of a causal pattern, counted one query at a time."""
  i = np.arange(n)
  l, c = settings['stride'], settings['summary_len']
  if settings['pattern'] == 'strided':
    local = np.minimum(i + 1, l)                  # 0 <= i - j < l
    summary = i // l                              # i - j = l, 2l, ... (distance 0 is local)
  else:
    local = i % l + 1                             # own block, j <= i
    full_blocks = i // l                          # earlier blocks: c summaries each
    summary = full_blocks * c
  return int(np.sum(local + summary))


def bigbird_pattern(n: int) -> jax.Array:
  return bigbird.random_block_pattern(
      bigbird.pattern_key(0, 0), num_blocks_for(n, BIGBIRD['block']), BIGBIRD['random_blocks'],
      BIGBIRD['window_blocks'], BIGBIRD['global_blocks'], causal=False)


def bigbird_blocked(q, k, v):
  n = q.shape[1]
  return bigbird.bigbird_attention(scaled(q), k, v, *one_document(n), None, bigbird_pattern(n),
                                   block=BIGBIRD['block'], window_blocks=BIGBIRD['window_blocks'],
                                   global_blocks=BIGBIRD['global_blocks'], max_global_tokens=0,
                                   causal=False)


def bigbird_block_allowed(n: int) -> np.ndarray:
  """`[num_blocks, num_blocks]` bool: which key blocks each query block attends to."""
  nb = num_blocks_for(n, BIGBIRD['block'])
  query, key = np.arange(nb)[:, None], np.arange(nb)[None, :]
  allowed = np.abs(query - key) <= BIGBIRD['window_blocks']
  allowed |= (query < BIGBIRD['global_blocks']) | (key < BIGBIRD['global_blocks'])
  with jax.ensure_compile_time_eval():     # a constant, also when called under jit
    pattern = np.asarray(bigbird_pattern(n))
  allowed[np.arange(nb)[:, None], pattern] = True
  return allowed


def bigbird_dense_mask(q, k, v):
  n = q.shape[1]
  blocks = jnp.arange(n) // BIGBIRD['block']
  allowed = jnp.asarray(bigbird_block_allowed(n))[blocks[:, None], blocks[None, :]]
  return attend(jnp.einsum('bqhd,bkhd->bhqk', scaled(q), k), allowed[None], v)


def bigbird_pairs(n: int) -> int:
  """Allowed pairs: block pairs times block size squared (n a multiple of the block)."""
  return int(bigbird_block_allowed(n).sum()) * BIGBIRD['block'] ** 2


def attention_flops(pairs: int) -> float:
  return 4.0 * HEADS * HEAD_DIM * pairs


def sparse_case(name: str, settings, dense: bool) -> AttentionCase:
  forward = sparse_dense_mask if dense else sparse_blocked
  return AttentionCase(
      variant=f'sparse_{name}_{"dense_mask" if dense else "blocked"}', make_inputs=make_qkv,
      forward=functools.partial(forward, settings=settings),
      flops=lambda n: attention_flops(sparse_pairs(n, settings)),
      max_seq_len=DENSE_MAX_LEN if dense else 16384)


CASES = [
    sparse_case('strided', STRIDED, dense=False),
    sparse_case('strided', STRIDED, dense=True),
    sparse_case('fixed', FIXED, dense=False),
    sparse_case('fixed', FIXED, dense=True),
    AttentionCase('bigbird_blocked', make_qkv, bigbird_blocked,
                  lambda n: attention_flops(bigbird_pairs(n))),
    AttentionCase('bigbird_dense_mask', make_qkv, bigbird_dense_mask,
                  lambda n: attention_flops(bigbird_pairs(n)), max_seq_len=DENSE_MAX_LEN),
]



def main() -> None:
  quick_check(CASES, __doc__.splitlines()[0])


if __name__ == '__main__':
  main()

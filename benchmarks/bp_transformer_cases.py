"""Attention-scaling cases for the BP-Transformer (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, no
padding, bidirectional, k = 4 and every level of the tree: a token attends to
2k + 1 tokens and up to 2k nodes per level, 9 + 8 log2(n) neighbours (89 at
1k, 113 at 4k), through the nodes to the whole chunk.

`bp_transformer_grouped` is the library's long-chunk path (`bp_transformer_attention`'s
'grouped': a level's queries in groups that share their nodes, O(n k log n));
`bp_transformer_gathered` its plain reading (each token's `[n, m]` neighbours
gathered); `bp_transformer_dense_mask` its dense path (taken for chunks up to
`dense_max_len`): the same nodes, then dense masked attention of every token over
all of [tokens; nodes], the mask and the relative-position indices scattered from
the same graph (skipped above 4k). The gathered path holds `[n, m, heads,
head_dim]` keys and values, 4 GiB each at 16k, so it stops at 8k. `flops(n)`:
4 * head_dim FLOPs per (token, neighbour) edge and head, plus the nodes'
attention to their two children.
"""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention import bp_transformer

HEADS, HEAD_DIM = 8, 64
K, NUM_LEVELS = 4, 14
DENSE_MAX_LEN = 4096


def make_inputs(n: int, key: jax.Array) -> tuple:
  """q, k, v: `[1, n, 8, 64]`; rel_keys `[num_levels + 1, 2k + 1, 8, 64]` (float32)."""
  keys = jax.random.split(key, 4)
  qkv = tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in keys[:3])
  return qkv + (jax.random.normal(keys[3], (NUM_LEVELS + 1, 2 * K + 1, HEADS, HEAD_DIM)),)


def one_document(n: int):
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  return positions, jnp.zeros_like(positions), jnp.ones(positions.shape, bool)


def scaled(q: jax.Array) -> jax.Array:
  return q / jnp.sqrt(jnp.float32(HEAD_DIM))


def on_path(path: str):
  """The library's attention on one of its `PATHS`, one document, bidirectional."""
  def forward(q, k, v, rel_keys):
    return bp_transformer.bp_transformer_attention(scaled(q), k, v, rel_keys,
                                                   *one_document(q.shape[1]), radius=K,
                                                   num_levels=NUM_LEVELS, causal=False, path=path)
  return forward


def edges(n: int) -> int:
  """(token, neighbour) edges plus (node, child) edges, summed over heads."""
  graph = bp_transformer.neighbour_graph(n, K, NUM_LEVELS, causal=False)
  nodes = sum(-(-n // 2 ** level) for level in range(1, bp_transformer.tree_levels(n, NUM_LEVELS)
                                                        + 1))
  return HEADS * (int(graph.present.sum()) + 2 * nodes)


CASES = [
    AttentionCase('bp_transformer_grouped', make_inputs, on_path('grouped'),
                  lambda n: 4.0 * HEAD_DIM * edges(n)),
    AttentionCase('bp_transformer_gathered', make_inputs, on_path('gathered'),
                  lambda n: 4.0 * HEAD_DIM * edges(n), max_seq_len=8192),
    AttentionCase('bp_transformer_dense_mask', make_inputs, on_path('dense'),
                  lambda n: 4.0 * HEAD_DIM * edges(n), max_seq_len=DENSE_MAX_LEN),
]

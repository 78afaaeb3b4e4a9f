"""Attention-scaling cases for the Image Transformer's local 1D attention (attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document. Query
blocks of 256 positions attend to themselves and the 256 positions before
them (l_q = l_m = 256): a query sees 256-512 keys, about a window of 512.
`image_local_1d_blocked` is the library's gathered path; `..._dense_mask`
builds the n x n mask from the same rule (skipped above 8k). `flops(n)`
counts the allowed (query, key) pairs exactly, 4 * head_dim * heads FLOPs each.
"""

import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase
from benchmarks.sparse_cases import DENSE_MAX_LEN, attention_flops, make_qkv, one_document, scaled
from longformer_jax.attention.image_local import attention as image_local
from longformer_jax.attention.core.dot_product import attend

LOCAL_1D = image_local.ImageLocalConfig(layout='1d', query_len=256, memory_len=256)


def local_1d_blocked(q, k, v):
  slots, query_len = image_local.key_slots(q.shape[1], LOCAL_1D)
  return image_local.gathered_local_attention(scaled(q), k, v, *one_document(q.shape[1]),
                                              slots, query_len)


def local_1d_allowed(n: int) -> np.ndarray:
  """`[n, n]` bool: key j in [block start - l_m, block end) and j <= i."""
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  block_start = (i // LOCAL_1D.query_len) * LOCAL_1D.query_len
  return (j >= block_start - LOCAL_1D.memory_len) & (j <= i)


def local_1d_dense_mask(q, k, v):
  allowed = jnp.asarray(local_1d_allowed(q.shape[1]))[None]
  return attend(jnp.einsum('bqhd,bkhd->bhqk', scaled(q), k), allowed, v)


def local_1d_pairs(n: int) -> int:
  i = np.arange(n)
  block_start = (i // LOCAL_1D.query_len) * LOCAL_1D.query_len
  return int(np.sum(i - np.maximum(block_start - LOCAL_1D.memory_len, 0) + 1))


CASES = [
    AttentionCase('image_local_1d_blocked', make_qkv, local_1d_blocked,
                  lambda n: attention_flops(local_1d_pairs(n))),
    AttentionCase('image_local_1d_dense_mask', make_qkv, local_1d_dense_mask,
                  lambda n: attention_flops(local_1d_pairs(n)), max_seq_len=DENSE_MAX_LEN),
]

"""Attention-scaling cases for Longformer's sliding window (benchmarks/attention_scaling.py).

Batch 1, 8 heads of 64, one document, no padding, "window 512" meaning 512
keys per query (plus the query itself):

- `longformer_blocked`: the library's blocked kernel, causal, one-sided
  window w = 512 (513 keys), automatic block size (128: slab of 640 keys).
- `longformer_blocked_two_sided`: encoder form, one-sided w = 256 (513 keys),
  i.e. Hugging Face's `attention_window = 512`.
- `longformer_dense_mask`: the same causal window as an n x n mask over
  dense masked attention (attention/dot_product.py); up to 8k (at 8k its
  forward + backward needs more than 24 GiB).
- `longformer_dense_mask_by_head`: the same, one head at a time (`lax.map`),
  so that the 8k forward + backward fits: the n x n work is unchanged.
- `full_causal`: dense causal attention without a window; up to 8k.
- `longformer_layer_two_sided`: Q, K, V projections of x [1, n, 512] plus the
  two-sided kernel: the same work as Hugging Face's LongformerSelfAttention,
  timed against it by attention_scaling.py (`hf_longformer_self_attention`).

`flops(n)`: 4 * heads * head_dim FLOPs per allowed (query, key) pair,
counted exactly (the band, not the slabs the kernel computes), plus the
projections for the layer case. Dense rows report the same useful FLOPs, so
their time over the floor shows the waste.
"""

import jax
import jax.numpy as jnp

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.sliding_window import (auto_block_size, band_pairs,
                                                     blocked_window_attention, window_allowed)

HEADS, HEAD_DIM, D_MODEL = 8, 64, 512
CAUSAL_WINDOW, TWO_SIDED_WINDOW = 512, 256
DENSE_MAX = 8192


def qkv_inputs(seq_len: int, key: jax.Array) -> tuple:
  return tuple(jax.random.normal(k, (1, seq_len, HEADS, HEAD_DIM)) for k in jax.random.split(key, 3))


def layer_inputs(seq_len: int, key: jax.Array) -> tuple:
  """x `[1, n, 512]` and three `[512, 8, 64]` projection kernels."""
  keys = jax.random.split(key, 4)
  x = jax.random.normal(keys[0], (1, seq_len, D_MODEL))
  kernels = [jax.random.normal(k, (D_MODEL, HEADS, HEAD_DIM)) / D_MODEL ** 0.5 for k in keys[1:]]
  return (x, *kernels)


def _stream_metadata(seq_len: int):
  positions = jnp.arange(seq_len, dtype=jnp.int32)[None]
  return positions, jnp.zeros_like(positions), jnp.ones((1, seq_len), bool)


def blocked(window: int, causal: bool):
  def forward(q, k, v):
    positions, segments, valid = _stream_metadata(q.shape[1])
    out, _ = blocked_window_attention(q, k, v, positions, segments, positions, segments, valid,
                                      window=window, block_size=auto_block_size(window),
                                      causal=causal, scale=HEAD_DIM ** -0.5)
    return out
  return forward


def dense(window, head_by_head: bool = False):
  """Dense masked attention, the n x n mask from positions (window None: plain causal).

  `head_by_head` runs the heads one after another (`lax.map`): the same n x n
  work, with the `[n, n]` arrays of one head alive at a time instead of eight.
  """
  def one_pass(q, k, v):
    positions = jnp.arange(q.shape[1], dtype=jnp.int32)
    distance_ok = positions[None, :] <= positions[:, None]
    if window is not None:
      distance_ok = window_allowed(positions[:, None], positions[None, :], window=window,
                                   dilation=1, causal=True)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) * HEAD_DIM ** -0.5
    return attend(logits, distance_ok[None], v)

  def forward(q, k, v):
    if not head_by_head:
      return one_pass(q, k, v)
    per_head = lambda x: jnp.moveaxis(x, 2, 0)[:, :, :, None]          # [h, b, n, 1, d]
    out = jax.lax.map(lambda qkv: one_pass(*qkv), (per_head(q), per_head(k), per_head(v)))
    return jnp.moveaxis(out[:, :, :, 0], 0, 2)
  return forward


def layer_two_sided(x, wq, wk, wv):
  project = lambda w: jnp.einsum('bld,dhe->blhe', x, w)
  return blocked(TWO_SIDED_WINDOW, causal=False)(project(wq), project(wk), project(wv))


def pair_flops(pairs: int) -> float:
  return 4.0 * HEADS * HEAD_DIM * pairs


CASES = [
    AttentionCase('longformer_blocked', qkv_inputs, blocked(CAUSAL_WINDOW, True),
                  lambda n: pair_flops(band_pairs(n, CAUSAL_WINDOW, True))),
    AttentionCase('longformer_blocked_two_sided', qkv_inputs, blocked(TWO_SIDED_WINDOW, False),
                  lambda n: pair_flops(band_pairs(n, TWO_SIDED_WINDOW, False))),
    AttentionCase('longformer_dense_mask', qkv_inputs, dense(CAUSAL_WINDOW),
                  lambda n: pair_flops(band_pairs(n, CAUSAL_WINDOW, True)), max_seq_len=DENSE_MAX),
    AttentionCase('longformer_dense_mask_by_head', qkv_inputs,
                  dense(CAUSAL_WINDOW, head_by_head=True),
                  lambda n: pair_flops(band_pairs(n, CAUSAL_WINDOW, True)), max_seq_len=DENSE_MAX),
    AttentionCase('full_causal', qkv_inputs, dense(None),
                  lambda n: pair_flops(n * (n + 1) // 2), max_seq_len=DENSE_MAX),
    AttentionCase('longformer_layer_two_sided', layer_inputs, layer_two_sided,
                  lambda n: pair_flops(band_pairs(n, TWO_SIDED_WINDOW, False))
                  + 3 * 2.0 * n * D_MODEL * HEADS * HEAD_DIM),
]

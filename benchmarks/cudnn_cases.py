"""cuDNN flash attention against XLA's attention, for attention_scaling.py (GPU only).

Cases (bfloat16 q, k, v `[1, n, 8, 64]`, through `jax.nn.dot_product_attention`):

- `xla_causal_bf16`: causal attention, `implementation='xla'` (the n x n
  logits in memory): the row cuDNN is measured against.
- `cudnn_causal`: the same through cuDNN's fused flash-attention kernel.
- `cudnn_window`: cuDNN with a causal sliding window
  (`local_window_size=(512, 0)`: the query and the 512 keys before it, the
  pairs of `longformer_blocked` in longformer_cases.py).
- `longformer_cudnn_window`: the same window as the Longformer layer runs it
  on a GPU (`attention/core/cudnn_window.py`: positions, documents and
  padding checked and packed, the blocked XLA kernel compiled beside it for
  inputs that do not pack): one document.
- `longformer_cudnn_window_docs`: the same over 8 documents of n / 8 tokens
  (cuDNN's packed segments).
- `longformer_cudnn_window_lse`: one document, also returning the
  log-sum-exp with its gradient (the path that merges global tokens);
  forward `out + lse`.

`flops(n)`: 4 * heads * head_dim per allowed (query, key) pair, as in
longformer_cases.py. cuDNN runs only on a GPU: on any other backend this file
has no cases, so a CPU run of the benchmark skips it.
"""

import jax
import jax.numpy as jnp

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention.core import cudnn_window
from longformer_jax.attention.core.sliding_window import (auto_block_size, band_pairs,
                                                          blocked_window_attention)

HEADS, HEAD_DIM, WINDOW = 8, 64, 512


def bf16_qkv_inputs(seq_len: int, key: jax.Array) -> tuple:
  return tuple(jax.random.normal(k, (1, seq_len, HEADS, HEAD_DIM), jnp.bfloat16)
               for k in jax.random.split(key, 3))


def dot_product(implementation: str, window=None):
  def forward(q, k, v):
    local = None if window is None else (window, 0)
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local,
                                        implementation=implementation)
  return forward


def project_window(documents: int = 1, with_lse: bool = False):
  def forward(q, k, v):
    n = q.shape[1]
    positions = jnp.arange(n, dtype=jnp.int32)[None]
    segments = positions // (n // documents)
    valid = jnp.ones((1, n), bool)
    fallback = lambda q, k, v: blocked_window_attention(
        q, k, v, positions, segments, positions, segments, valid, window=WINDOW,
        block_size=auto_block_size(WINDOW), causal=True, scale=HEAD_DIM ** -0.5)
    result = cudnn_window.window_attention(q, k, v, positions, segments, valid, window=WINDOW,
                                           scale=HEAD_DIM ** -0.5, fallback=fallback,
                                           with_lse=with_lse)
    return result[0] + result[1][..., None] if with_lse else result
  return forward


def pair_flops(pairs: int) -> float:
  return 4.0 * HEADS * HEAD_DIM * pairs


CASES = [] if jax.default_backend() != 'gpu' else [
    AttentionCase('xla_causal_bf16', bf16_qkv_inputs, dot_product('xla'),
                  lambda n: pair_flops(n * (n + 1) // 2), max_seq_len=16384),
    AttentionCase('cudnn_causal', bf16_qkv_inputs, dot_product('cudnn'),
                  lambda n: pair_flops(n * (n + 1) // 2)),
    AttentionCase('cudnn_window', bf16_qkv_inputs, dot_product('cudnn', WINDOW),
                  lambda n: pair_flops(band_pairs(n, WINDOW, True))),
    AttentionCase('longformer_cudnn_window', bf16_qkv_inputs, project_window(),
                  lambda n: pair_flops(band_pairs(n, WINDOW, True))),
    AttentionCase('longformer_cudnn_window_docs', bf16_qkv_inputs, project_window(8),
                  lambda n: pair_flops(band_pairs(n, WINDOW, True))),
    AttentionCase('longformer_cudnn_window_lse', bf16_qkv_inputs, project_window(1, True),
                  lambda n: pair_flops(band_pairs(n, WINDOW, True))),
]

"""cuDNN flash attention against XLA's attention, for attention_scaling.py (GPU only).

Cases (bfloat16 q, k, v `[1, n, 8, 64]`, through `jax.nn.dot_product_attention`):

- `xla_causal_bf16`: causal attention, `implementation='xla'` (the n x n
  logits in memory): the row cuDNN is measured against.
- `cudnn_causal`: the same through cuDNN's fused flash-attention kernel.
- `cudnn_window`: cuDNN with a causal sliding window
  (`local_window_size=(512, 0)`: the query and the 512 keys before it, the
  pairs of `longformer_blocked` in longformer_cases.py).

`flops(n)`: 4 * heads * head_dim per allowed (query, key) pair, as in
longformer_cases.py. cuDNN runs only on a GPU: on any other backend this file
has no cases, so a CPU run of the benchmark skips it.
"""

import jax
import jax.numpy as jnp

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention.core.sliding_window import band_pairs

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


def pair_flops(pairs: int) -> float:
  return 4.0 * HEADS * HEAD_DIM * pairs


CASES = [] if jax.default_backend() != 'gpu' else [
    AttentionCase('xla_causal_bf16', bf16_qkv_inputs, dot_product('xla'),
                  lambda n: pair_flops(n * (n + 1) // 2), max_seq_len=16384),
    AttentionCase('cudnn_causal', bf16_qkv_inputs, dot_product('cudnn'),
                  lambda n: pair_flops(n * (n + 1) // 2)),
    AttentionCase('cudnn_window', bf16_qkv_inputs, dot_product('cudnn', WINDOW),
                  lambda n: pair_flops(band_pairs(n, WINDOW, True))),
]

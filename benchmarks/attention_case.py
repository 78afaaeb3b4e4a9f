"""One row family of the attention scaling benchmark (`benchmarks/attention_scaling.py`).

Each variant file `benchmarks/*_cases.py` exports `CASES: list[AttentionCase]`.
The benchmark times `forward(*make_inputs(n, key))` ("fwd") and the gradient
of `sum(forward(...))` with respect to every float input ("fwd_bwd"), and
compares the time with `flops(n)` over the float32 matmul rate (the floor).
Shapes: batch 1, 8 heads of 64 (`[1, n, 8, 64]`), window 512.
"""

import dataclasses
from typing import Callable

import jax


@dataclasses.dataclass(frozen=True)
class AttentionCase:
  variant: str                                    # the row's `variant`, e.g. 'longformer_blocked', 'dense_mask'
  make_inputs: Callable[[int, jax.Array], tuple]  # (seq_len, key) -> tuple of arrays: q, k, v ... ([1, n, 8, 64])
  forward: Callable[..., jax.Array]               # *inputs -> output array (pure, jittable); fwd_bwd = grad of sum(out) wrt all float inputs
  flops: Callable[[int], float]                   # seq_len -> forward FLOPs of the variant's own useful computation (2 per multiply-add)
  max_seq_len: int = 16384                        # longer lengths are skipped (e.g. dense at 16k)

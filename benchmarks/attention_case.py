"""One row family of the attention scaling benchmark (`benchmarks/attention_scaling.py`).

Each variant file `benchmarks/*_cases.py` exports `CASES: list[AttentionCase]`.
The benchmark times `forward(*make_inputs(n, key))` ("fwd") and the gradient
of `sum(forward(...))` with respect to every float input ("fwd_bwd"), and
compares the time with `flops(n)` over the float32 matmul rate (the floor).
Shapes: batch 1, 8 heads of 64 (`[1, n, 8, 64]`), window 512.
"""

import argparse
import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class AttentionCase:
  variant: str                                    # the row's `variant`, e.g. 'longformer_blocked', 'dense_mask'
  make_inputs: Callable[[int, jax.Array], tuple]  # (seq_len, key) -> tuple of arrays: q, k, v ... ([1, n, 8, 64])
  forward: Callable[..., jax.Array]               # *inputs -> output array (pure, jittable); fwd_bwd = grad of sum(out) wrt all float inputs
  flops: Callable[[int], float]                   # seq_len -> forward FLOPs of the variant's own useful computation (2 per multiply-add)
  max_seq_len: int = 16384                        # longer lengths are skipped (e.g. dense at 16k)


def seconds(fn, *args) -> float:
  """Wall time of one call after a compiling call."""
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def quick_check(cases: list, description: str) -> None:
  """`python -m benchmarks.X_cases --seq_len=N`: each case once, then every `*_blocked`
  output against its `*_dense_mask` twin (max |difference| < 1e-4)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument('--seq_len', type=int, default=1024)
  n = parser.parse_args().seq_len
  outputs = {}
  for case in cases:
    if n > case.max_seq_len:
      continue
    inputs = case.make_inputs(n, jax.random.PRNGKey(0))
    floats = tuple(i for i, a in enumerate(inputs) if jnp.issubdtype(a.dtype, jnp.floating))
    forward = jax.jit(case.forward)
    fwd_bwd = jax.jit(jax.grad(lambda *a: jnp.sum(case.forward(*a)), argnums=floats))
    outputs[case.variant] = np.asarray(forward(*inputs))
    print(f'{case.variant:30s} n={n}  fwd {seconds(forward, *inputs):.3f}s  '
          f'fwd_bwd {seconds(fwd_bwd, *inputs):.3f}s  {case.flops(n) / 1e9:.2f} GFLOP')
  for blocked in [v for v in outputs if v.endswith('_blocked')]:
    dense = blocked.replace('_blocked', '_dense_mask')
    if dense in outputs:
      error = np.abs(outputs[blocked] - outputs[dense]).max()
      print(f'{blocked} vs {dense}: max |difference| {error:.2e}')
      assert error < 1e-4, (blocked, error)

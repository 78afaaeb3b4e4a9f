"""The float32 matmul rate of this machine, measured with JAX (the MFU and floor denominator).

The rate moves with load (by 2x on a shared 2-core CPU), so the benchmarks
measure it next to each timed row, in the same process: `measure()` before
and after the row's timed runs, and the row uses the mean of the two.
A square matmul of `default_size()` is timed repeatedly until at least
`min_repeats` timings and `min_seconds` of timed work: on a GPU, 2048^3 runs
in a fraction of a millisecond (launch-bound), so the size is chosen by
backend.
"""

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp

SIZE_BY_BACKEND = {'cpu': 2048, 'gpu': 8192, 'cuda': 8192, 'rocm': 8192, 'tpu': 8192}


@dataclasses.dataclass(frozen=True)
class MatmulRate:
  best_flops_per_s: float     # 2 size^3 over the fastest timing
  median_flops_per_s: float   # 2 size^3 over the median timing
  size: int
  timings: int


def default_size(backend: str | None = None) -> int:
  """Side of the square matmul timed on `backend` (default: JAX's default backend)."""
  return SIZE_BY_BACKEND.get(backend or jax.default_backend(), 2048)


def measure(size: int | None = None, min_repeats: int = 5, min_seconds: float = 0.5,
            dtype=jnp.float32) -> MatmulRate:
  """Times `[size, size] @ [size, size]` in `dtype` (float32 unless asked: the rate of
  bfloat16 models on a GPU is the bfloat16 one) after a compiling call.

  Repeats until both `min_repeats` timings and `min_seconds` of timed work.
  """
  size = size or default_size()
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (size, size), dtype)
  matmul = jax.jit(jnp.matmul)
  matmul(a, b).block_until_ready()
  times = []
  while len(times) < min_repeats or sum(times) < min_seconds:
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  flops = 2.0 * size ** 3
  return MatmulRate(best_flops_per_s=flops / min(times),
                    median_flops_per_s=flops / statistics.median(times),
                    size=size, timings=len(times))


def float32_matmul_flops_per_s(size: int | None = None) -> float:
  """The best rate of `measure(size)` in FLOP/s."""
  return measure(size).best_flops_per_s

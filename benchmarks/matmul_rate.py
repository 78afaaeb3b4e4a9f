"""The float32 matmul rate of this machine, measured with JAX (the MFU denominator)."""

import time

import jax
import jax.numpy as jnp


def float32_matmul_flops_per_s(size: int = 2048, repeats: int = 5) -> float:
  """Best of `repeats` timings of a `[size, size] @ [size, size]` float32 matmul."""
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (size, size), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  matmul(a, b).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * size ** 3 / best

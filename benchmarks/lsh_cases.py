"""Attention-scaling cases for Reformer LSH attention (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, causal,
no padding. Inputs are the shared query/key vectors and the values,
`[1, n, 8, 64]`; the random rotations are fixed (key 0) inside `forward`.
Buckets per round: n / lsh_chunk_len, so that a bucket holds about one chunk
of tokens on average (the Reformer's setting).

- `lsh_h2_c64`, `lsh_h4_c64`: 2 or 4 hash rounds, chunks of 64: each query
  scores 128 candidate keys (own + previous chunk) per round.
- `lsh_h4_c256`: 4 rounds, chunks of 256: 512 candidates per round, the
  span of a window of 512 (per round).

`flops(n)`: the computed work, per round: hashing (2 * n * head_dim *
buckets/2 per head) and q.k plus p.v over each query's 2 * chunk_len
candidate keys (4 * head_dim per pair per head). The same-bucket mask keeps
only part of those pairs (data-dependent), so the useful share is smaller.

Quick check (each case once at one length, forward and forward+backward):
  python -m benchmarks.lsh_cases --seq_len=1024
"""

import argparse
import functools
import time

import jax
import jax.numpy as jnp

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention.lsh.attention import lsh_attention, random_rotations

HEADS, HEAD_DIM = 8, 64


def make_qk_v(n: int, key: jax.Array) -> tuple:
  """qk, v: `[1, n, 8, 64]` float32."""
  return tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in jax.random.split(key, 2))


def num_buckets(n: int, chunk_len: int) -> int:
  """About one chunk of tokens per bucket; even, at least 2."""
  return max(2, 2 * (n // chunk_len // 2))


def lsh_forward(qk: jax.Array, v: jax.Array, *, num_hashes: int, chunk_len: int) -> jax.Array:
  n = qk.shape[1]
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  rotations = random_rotations(jax.random.PRNGKey(0), HEADS, HEAD_DIM, num_hashes,
                               num_buckets(n, chunk_len))
  return lsh_attention(qk, v, positions, jnp.zeros_like(positions), jnp.ones((1, n), bool),
                       rotations, chunk_len=chunk_len, causal=True)


def lsh_flops(n: int, *, num_hashes: int, chunk_len: int) -> float:
  hashing = 2 * n * HEAD_DIM * num_buckets(n, chunk_len) // 2
  attention = 4 * HEAD_DIM * n * 2 * chunk_len
  return float(HEADS * num_hashes * (hashing + attention))


def lsh_case(num_hashes: int, chunk_len: int) -> AttentionCase:
  settings = dict(num_hashes=num_hashes, chunk_len=chunk_len)
  return AttentionCase(
      variant=f'lsh_h{num_hashes}_c{chunk_len}',
      make_inputs=make_qk_v,
      forward=functools.partial(lsh_forward, **settings),
      flops=functools.partial(lsh_flops, **settings))


CASES = [lsh_case(2, 64), lsh_case(4, 64), lsh_case(4, 256)]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seq_len', type=int, default=1024)
  args = parser.parse_args()
  for case in CASES:
    inputs = case.make_inputs(args.seq_len, jax.random.PRNGKey(1))
    forward = jax.jit(case.forward)
    fwd_bwd = jax.jit(jax.grad(lambda *a: jnp.sum(case.forward(*a)), argnums=(0, 1)))
    for mode, fn in (('fwd', forward), ('fwd_bwd', fwd_bwd)):
      jax.block_until_ready(fn(*inputs))
      start = time.perf_counter()
      jax.block_until_ready(fn(*inputs))
      seconds = time.perf_counter() - start
      print(f'{case.variant:14s} n={args.seq_len} {mode:8s} {seconds * 1e3:8.1f} ms  '
            f'{case.flops(args.seq_len) / 1e9:6.2f} GFLOP fwd')


if __name__ == '__main__':
  main()

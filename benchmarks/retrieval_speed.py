"""Cost of top-k memory retrieval relative to the plain query-key matmul.

  python benchmarks/retrieval_speed.py [--quick] [--out FILE.json]

512 queries of dimension 64 against a key-value memory of 65,536 entries,
k = 32 (the Memorizing Transformer's setting, one head): times
`key_value.retrieve` with exact `jax.lax.top_k` and with
`jax.lax.approx_max_k` (recall target 0.95), and the plain
`[512, 64] x [64, 65536]` matmul of the same size, in one run (best of
`--repeats`). Prints one line per method:

  method=exact retrieval_ms=... matmul_ms=... retrieval_over_matmul=...

On CPU approx_max_k is computed exactly, so the two methods cost
about the same; the approximate one is fast on TPU. `--quick` is a smoke run
(64 queries, 4,096 entries, 2 repeats). `--out` writes the rows as JSON.
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

import jax
import jax.numpy as jnp

from longformer_jax.memory import key_value


def best_time_s(function, args, repeats: int) -> float:
  """Best wall time of `function(*args)` over `repeats` runs after one warm-up (compile)."""
  jax.block_until_ready(function(*args))
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(function(*args))
    best = min(best, time.perf_counter() - start)
  return best


def filled_memory(capacity: int, head_dim: int, seed: int = 0):
  """A one-row, one-head memory with every entry valid and random keys/values."""
  keys, values = jax.random.normal(jax.random.PRNGKey(seed), (2, 1, capacity, 1, head_dim))
  memory = key_value.create(1, capacity, 1, head_dim)
  return memory.replace(data={'keys': keys, 'values': values},
                        positions=jnp.arange(capacity, dtype=jnp.int32)[None],
                        valid=jnp.ones((1, capacity), bool))


def measure(num_queries: int, capacity: int, head_dim: int, k: int, repeats: int,
            recall_target: float = 0.95) -> list[dict]:
  memory = filled_memory(capacity, head_dim)
  queries = jax.random.normal(jax.random.PRNGKey(1), (1, num_queries, 1, head_dim))
  matmul = jax.jit(lambda q, keys: q @ keys.T)
  matmul_s = best_time_s(matmul, (queries[0, :, 0], memory.data['keys'][0, :, 0]), repeats)
  rows = []
  for method in ('exact', 'approx'):
    retrieve = jax.jit(lambda m, q, method=method: key_value.retrieve(
        m, q, k, method=method, recall_target=recall_target))
    retrieval_s = best_time_s(retrieve, (memory, queries), repeats)
    rows.append(dict(method=method, queries=num_queries, capacity=capacity, head_dim=head_dim,
                     k=k, recall_target=recall_target, backend=jax.default_backend(),
                     retrieval_ms=1e3 * retrieval_s, matmul_ms=1e3 * matmul_s,
                     retrieval_over_matmul=retrieval_s / matmul_s))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='smoke run: small sizes, 2 repeats')
  parser.add_argument('--out', help='write the rows to this JSON file')
  parser.add_argument('--repeats', type=int, default=10)
  args = parser.parse_args()
  if args.quick:
    rows = measure(num_queries=64, capacity=4096, head_dim=64, k=32, repeats=2)
  else:
    rows = measure(num_queries=512, capacity=65536, head_dim=64, k=32, repeats=args.repeats)
  for row in rows:
    print(f"method={row['method']} queries={row['queries']} capacity={row['capacity']} k={row['k']} "
          f"retrieval_ms={row['retrieval_ms']:.2f} matmul_ms={row['matmul_ms']:.2f} "
          f"retrieval_over_matmul={row['retrieval_over_matmul']:.2f}")
  if args.out:
    with open(args.out, 'w') as file:
      json.dump(rows, file, indent=2)


if __name__ == '__main__':
  main()

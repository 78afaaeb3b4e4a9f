"""Cost of top-k memory retrieval relative to the plain query-key matmul.

  python benchmarks/retrieval_speed.py [--quick] [--repeats N] [--out FILE.json]

512 queries of dimension 64 against a key-value memory of 65,536 entries,
k = 32 (the Memorizing Transformer's setting, one head): times
`key_value.retrieve` with the exact top-k (tile by tile,
memory/tiled_top_k.py) and with `jax.lax.approx_max_k` (recall target 0.95),
and, as an ablation, the exact top-k on the whole score matrix by block
maxima (memory/block_top_k.py, the path before the tiles) and by one
`jax.lax.top_k` pass.

Then the memory step of the passkey grid's kNN layer (16 rows, 4 heads of
32, 128 queries, 65,536 entries, k = 32), with the memory full and half
full: retrieval tile by tile against block maxima on the whole score
matrix, and insertion's ranking of 128 victims among 65,536 + 128
candidates (memory/partial_ranking.py against the one sort over all). The plain `[512, 64] x [64, 65536]` matmul
of the same size is timed right before and after each method; every ratio
uses the median of those matmul runs and the median of the method's
`--repeats` runs, with the fastest and slowest run beside it. Prints one
line per method:

  method=exact ... retrieval_ms=... matmul_ms=... retrieval_over_matmul=... (min-max ...)

On CPU approx_max_k is computed exactly (one heap pass, like lax.top_k); it
is fast on TPU. `--quick` is a smoke run (64 queries, 4,096 entries, 3
repeats). `--out` writes the rows as JSON.
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

from longformer_jax.attention.memorizing import FIFO
from longformer_jax.memory import insertion, key_value, partial_ranking, policies, tiled_top_k
from longformer_jax.memory.block_top_k import block_top_k


def timed_s(function, args, repeats: int) -> list[float]:
  """Wall times of `function(*args)` over `repeats` runs after one warm-up (compile)."""
  jax.block_until_ready(function(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(function(*args))
    times.append(time.perf_counter() - start)
  return times


def median(values: list[float]) -> float:
  ordered = sorted(values)
  middle = len(ordered) // 2
  return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def filled_memory(capacity: int, head_dim: int, seed: int = 0, rows: int = 1, heads: int = 1,
                  fill: float = 1.0):
  """A memory with random keys/values, its first `fill` of the slots valid."""
  keys, values = jax.random.normal(jax.random.PRNGKey(seed),
                                   (2, rows, capacity, heads, head_dim))
  memory = key_value.create(rows, capacity, heads, head_dim)
  slots = jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (rows, capacity))
  return memory.replace(data={'keys': keys, 'values': values}, positions=slots,
                        valid=slots < int(fill * capacity))


def untiled_retrieve(memory, queries, k: int):
  """The exact top-k on the whole `[b, h, q, M]` score matrix (block maxima)."""
  scores = key_value.similarities(memory, queries, masked=False)
  return block_top_k(scores, k, valid=memory.valid[:, None, None, :])


def _ratio_row(method: str, times: list, before: list, after: list, **fields) -> dict:
  matmul_s = median(before + after)
  return dict(method=method, backend=jax.default_backend(), repeats=len(times),
              retrieval_ms=1e3 * median(times),
              retrieval_min_ms=1e3 * min(times), retrieval_max_ms=1e3 * max(times),
              matmul_ms=1e3 * matmul_s, matmul_before_ms=1e3 * median(before),
              matmul_after_ms=1e3 * median(after),
              retrieval_over_matmul=median(times) / matmul_s,
              spread_over_matmul=[min(times) / matmul_s, max(times) / matmul_s], **fields)


def measure_memory_step(rows: int, heads: int, head_dim: int, queries: int, capacity: int,
                        k: int, repeats: int) -> list[dict]:
  """The kNN layer's step: retrieval (full, half-full memory) and insertion's ranking, each
  beside the batched query-key matmul (`[rows, heads]` x `[queries, d] x [d, M]`)."""
  query = jax.random.normal(jax.random.PRNGKey(2), (rows, queries, heads, head_dim))
  matmul = jax.jit(lambda q, m: jnp.einsum('bqhd,bmhd->bhqm', q, m.data['keys']).max(-1))
  shape = dict(queries=queries, capacity=capacity, head_dim=head_dim, k=k, rows=rows,
               heads=heads)
  out = []
  for fill in (1.0, 0.5):
    memory = filled_memory(capacity, head_dim, rows=rows, heads=heads, fill=fill)
    for method, function in (
        ('step_retrieve', jax.jit(lambda m, q: key_value.retrieve(m, q, k))),
        ('step_top_k_tiled', jax.jit(lambda m, q: tiled_top_k.tiled_top_k(
            m.data['keys'], m.valid, q, k))),
        ('step_top_k_untiled', jax.jit(lambda m, q: untiled_retrieve(m, q, k)))):
      before = timed_s(matmul, (query, memory), repeats)
      times = timed_s(function, (memory, query), repeats)
      after = timed_s(matmul, (query, memory), repeats)
      out.append(_ratio_row(f'{method}_fill{int(fill * 100)}', times, before, after, **shape))
  memory = filled_memory(capacity, head_dim, rows=rows, heads=heads)
  new = key_value.entries_from_chunk(query, query, jnp.full((rows, queries), capacity, jnp.int32),
                                     jnp.zeros((rows, queries), jnp.int32),
                                     jnp.ones((rows, queries), bool))
  new = new.replace(data_axes=memory.data_axes)
  keys = policies.eviction_keys(FIFO, jax.tree_util.tree_map(
      lambda a, b: jnp.concatenate([a, b], axis=1), insertion.metadata(memory),
      insertion.metadata(new)))
  for method, function in (
      ('insert_ranking_partial', jax.jit(lambda c: partial_ranking.first_in_order(c, queries))),
      ('insert_ranking_full_sort', jax.jit(lambda c: policies.ranked_slots(c)[:, :queries]))):
    before = timed_s(matmul, (query, memory), repeats)
    times = timed_s(function, (keys,), repeats)
    after = timed_s(matmul, (query, memory), repeats)
    out.append(_ratio_row(method, times, before, after, **shape))
  return out


def measure(num_queries: int, capacity: int, head_dim: int, k: int, repeats: int,
            recall_target: float = 0.95) -> list[dict]:
  """One row per method. The matmul is timed right before and right after each
  method's runs and the ratio uses the median of both, so a change of the
  machine's load moves numerator and denominator together."""
  memory = filled_memory(capacity, head_dim)
  queries = jax.random.normal(jax.random.PRNGKey(1), (1, num_queries, 1, head_dim))
  matmul = jax.jit(lambda q, keys: q @ keys.T)
  matmul_args = (queries[0, :, 0], memory.data['keys'][0, :, 0])
  scores = key_value.similarities(memory, queries)
  methods = {
      # The whole retrieval: scores, top-k, gathers of keys, values and metadata.
      name: (jax.jit(lambda m, q, name=name: key_value.retrieve(
          m, q, k, method=name, recall_target=recall_target)), (memory, queries))
      for name in ('exact', 'approx')}
  # Ablation: exact top-k on the whole score matrix (the path before the tiles), and the
  # top-k step alone on the same scores, block maxima against one heap pass.
  methods['exact_untiled'] = (jax.jit(lambda m, q: untiled_retrieve(m, q, k)), (memory, queries))
  methods['top_k_only_blocked'] = (jax.jit(lambda s: block_top_k(s, k)), (scores,))
  methods['top_k_only_lax'] = (jax.jit(lambda s: jax.lax.top_k(s, k)), (scores,))
  rows = []
  for method, (function, args) in methods.items():
    before = timed_s(matmul, matmul_args, repeats)
    times = timed_s(function, args, repeats)
    after = timed_s(matmul, matmul_args, repeats)
    rows.append(_ratio_row(method, times, before, after, queries=num_queries,
                           capacity=capacity, head_dim=head_dim, k=k,
                           recall_target=recall_target))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='smoke run: small sizes, 2 repeats')
  parser.add_argument('--out', help='write the rows to this JSON file')
  parser.add_argument('--repeats', type=int, default=7)
  args = parser.parse_args()
  if args.quick:
    rows = measure(num_queries=64, capacity=4096, head_dim=64, k=32, repeats=3)
    rows += measure_memory_step(rows=2, heads=2, head_dim=16, queries=16, capacity=8192, k=8,
                                repeats=3)
  else:
    rows = measure(num_queries=512, capacity=65536, head_dim=64, k=32, repeats=args.repeats)
    rows += measure_memory_step(rows=16, heads=4, head_dim=32, queries=128, capacity=65536,
                                k=32, repeats=args.repeats)
  for row in rows:
    print(f"method={row['method']} queries={row['queries']} capacity={row['capacity']} k={row['k']} "
          f"retrieval_ms={row['retrieval_ms']:.2f} matmul_ms={row['matmul_ms']:.2f} "
          f"retrieval_over_matmul={row['retrieval_over_matmul']:.2f} "
          f"(min-max {row['spread_over_matmul'][0]:.2f}-{row['spread_over_matmul'][1]:.2f})")
  if args.out:
    with open(args.out, 'w') as file:
      json.dump(rows, file, indent=2)


if __name__ == '__main__':
  main()

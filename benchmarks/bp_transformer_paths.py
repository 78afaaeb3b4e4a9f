"""BP-Transformer's three attention paths, grouped, gathered and dense, timed against length.

`bp_transformer_attention` takes each level's queries in groups that share their
nodes ('grouped', O(n k log n)), gathers each token's `[n, m]` neighbours
('gathered', O(n k log n)), or attends over all of [tokens; nodes] under the
graph's mask ('dense', O(n^2)). The layer takes the dense path up to
`BPTransformerConfig.dense_max_len` and the grouped one beyond; this prints where
the crossover lies, so that the default follows a measurement. Forward +
backward of one layer's attention at the LRA mini shapes (batch 32, 4 heads of
32, k = 4, one document), the three paths' repeats interleaved, medians with
the spread, and the float32 matmul rate measured before and after in the same
process:

  python -m benchmarks.bp_transformer_paths [--seq_lens=64,128,256,512,1024,2048]
      [--repeats=5] [--out=FILE.json]
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import matmul_rate
from longformer_jax.attention.bp_transformer import bp_transformer_attention

BATCH, HEADS, HEAD_DIM, K, NUM_LEVELS = 32, 4, 32, 4, 8


PATHS = ('grouped', 'gathered', 'dense')


def step_function(n: int, path: str):
  """Jitted gradient of one attention call w.r.t. q, k, v and the relative keys."""
  positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (BATCH, n))
  segments, valid = jnp.zeros_like(positions), jnp.ones(positions.shape, bool)

  def loss(q, k, v, rel_keys):
    out = bp_transformer_attention(q, k, v, rel_keys, positions, segments, valid, radius=K,
                                   num_levels=NUM_LEVELS, causal=False, path=path)
    return jnp.sum(out * out)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def inputs(n: int) -> tuple:
  keys = jax.random.split(jax.random.PRNGKey(n), 4)
  qkv = tuple(jax.random.normal(key, (BATCH, n, HEADS, HEAD_DIM)) / 4 for key in keys[:3])
  return qkv + (jax.random.normal(keys[3], (NUM_LEVELS + 1, 2 * K + 1, HEADS, HEAD_DIM)),)


def time_row(n: int, repeats: int) -> dict:
  args = inputs(n)
  steps = {name: step_function(n, name) for name in PATHS}
  for step in steps.values():
    jax.block_until_ready(step(*args))                     # compile
  before = matmul_rate.measure().median_flops_per_s
  times = {name: [] for name in steps}
  for _ in range(repeats):
    for name, step in steps.items():
      start = time.perf_counter()
      jax.block_until_ready(step(*args))
      times[name].append(time.perf_counter() - start)
  after = matmul_rate.measure().median_flops_per_s
  row = {'seq_len': n, 'matmul_gflops': [round(before / 1e9, 1), round(after / 1e9, 1)]}
  for name, values in times.items():
    row[f'{name}_ms'] = round(1e3 * statistics.median(values), 2)
    row[f'{name}_ms_range'] = [round(1e3 * min(values), 2), round(1e3 * max(values), 2)]
  for name in ('gathered', 'dense'):
    row[f'{name}_over_grouped'] = round(row[f'{name}_ms'] / row['grouped_ms'], 2)
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seq_lens', default='64,128,256,512,1024,2048')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  rows = []
  print(f'batch {BATCH}, {HEADS} heads of {HEAD_DIM}, k = {K}; forward + backward, '
        f'median of {args.repeats} (min-max)')
  for n in (int(s) for s in args.seq_lens.split(',')):
    row = time_row(n, args.repeats)
    rows.append(row)
    times = '  '.join(f"{name} {row[name + '_ms']:8.1f} ms {row[name + '_ms_range']}"
                      for name in PATHS)
    print(f"n={n:5d}  {times}  gathered / grouped {row['gathered_over_grouped']:.2f}  "
          f"dense / grouped {row['dense_over_grouped']:.2f}  "
          f"matmul GFLOP/s {row['matmul_gflops']}", flush=True)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'device': jax.devices()[0].device_kind, 'rows': rows}, f, indent=1)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())

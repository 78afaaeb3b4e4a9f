"""What the FLOP floor assumes against what the kernels' own matmul shapes reach.

  python benchmarks/matmul_shapes.py [--repeats N] [--out FILE.json]

The `over_floor` of `attention_scaling.py` and the MFU of `train_throughput.py`
divide by the rate of one large square matmul (`matmul_rate.py`, 2048^3 on
CPU). The kernels and the default model do their work in much smaller
matmuls. This script times, in one process, the square matmul before and
after, and between them the matmuls of those shapes (float32, forward only):

  * the attention kernels at 16k tokens, 8 heads of 64: per query step of 128
    queries, `[steps, 8, 128, 64] x [steps, 8, keys, 64]` (scores, q k^T) and
    `[steps, 8, 128, keys] x [steps, 8, keys, 64]` (weights times values), with
    keys = 640 (Longformer's slab, the Sparse Transformer's strided local part)
    and 384 (BigBird's window + random blocks);
  * the default model (`configs/default.py`: batch 8 x chunk 256 = 2,048 tokens,
    d_model 256, 4 heads of 64, d_ff 1024, memory 128): the projections
    `[2048, 256] x [256, 768]` (q, k, v) and `[2048, 256] x [256, 1024]`,
    `[2048, 1024] x [1024, 256]` (feed-forward), and the attention
    `[8, 4, 256, 64] x [8, 4, 384, 64]`.

Each row is the median rate over `--repeats` runs (after a compiling call) and
its ratio to the square matmul's median rate (`rate_over_square`, below 1 when
the shape runs slower). Prints one line per shape.
"""

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

import jax
import jax.numpy as jnp

from benchmarks.matmul_rate import measure

# name -> (einsum, left shape, right shape)
SHAPES = {
    'kernel_scores_640': ('nhqd,nhkd->nhqk', (128, 8, 128, 64), (128, 8, 640, 64)),
    'kernel_values_640': ('nhqk,nhkd->nhqd', (128, 8, 128, 640), (128, 8, 640, 64)),
    'kernel_scores_384': ('nhqd,nhkd->nhqk', (128, 8, 128, 64), (128, 8, 384, 64)),
    'kernel_values_384': ('nhqk,nhkd->nhqd', (128, 8, 128, 384), (128, 8, 384, 64)),
    'model_qkv_projection': ('td,de->te', (2048, 256), (256, 768)),
    'model_feed_forward_in': ('td,de->te', (2048, 256), (256, 1024)),
    'model_feed_forward_out': ('td,de->te', (2048, 1024), (1024, 256)),
    'model_attention_scores': ('bhqd,bhkd->bhqk', (8, 4, 256, 64), (8, 4, 384, 64)),
    'model_attention_values': ('bhqk,bhkd->bhqd', (8, 4, 256, 384), (8, 4, 384, 64)),
}


def flops_of(equation: str, left: tuple, right: tuple) -> float:
  """2 x the product of every distinct axis size of the einsum."""
  inputs = equation.split('->')[0].split(',')
  sizes = dict(zip(inputs[0], left)) | dict(zip(inputs[1], right))
  total = 2.0
  for size in sizes.values():
    total *= size
  return total


def median_seconds(function, args, repeats: int) -> float:
  jax.block_until_ready(function(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(function(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--out', help='write the rows as JSON')
  args = parser.parse_args()
  before = measure().median_flops_per_s
  rows = []
  for name, (equation, left, right) in SHAPES.items():
    a = jax.random.normal(jax.random.PRNGKey(0), left, jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), right, jnp.float32)
    seconds = median_seconds(jax.jit(lambda x, y, e=equation: jnp.einsum(e, x, y)), (a, b),
                             args.repeats)
    rows.append(dict(shape=name, equation=equation, left=left, right=right,
                     gflops=flops_of(equation, left, right) / seconds / 1e9))
  after = measure().median_flops_per_s
  square = 0.5 * (before + after) / 1e9
  for row in rows:
    row.update(square_gflops=square, square_gflops_before=before / 1e9,
               square_gflops_after=after / 1e9, rate_over_square=row['gflops'] / square,
               device=str(jax.devices()[0]))
    print(f"shape={row['shape']} gflops={row['gflops']:.0f} square_gflops={square:.0f} "
          f"rate_over_square={row['rate_over_square']:.2f}")
  if args.out:
    with open(args.out, 'w') as file:
      json.dump(rows, file, indent=2)


if __name__ == '__main__':
  main()

"""Where the Pallas block-sparse kernel's time goes on a GPU: a sweep of its static shape.

    JAX_PLATFORMS=cuda python benchmarks/block_sparse_tuning.py --out tuning.json \
        [--seq_len 16384] [--repeats 10] [--before path/to/block_sparse_flash.py] \
        [--budget_s 300] [--tunings block_128x64_warps_4,block_128x64_warps_8]

For the Sparse Transformer's strided and BigBird's patterns of
`benchmarks/pallas_gpu_cases.py` (batch 1, 8 heads of 64, bfloat16), each
`KernelTuning` of the grid below is timed forward + backward (the gradient of
sum(out) w.r.t. q, k, v, as attention_scaling.py's `fwd_bwd`): the median of
`repeats` calls after a compiling one, with the min and max. cuDNN's causal
attention (`cudnn_causal`) is timed in the same process, first and last, and
each row prints its ratio to the issue's target: cuDNN's causal time scaled
by the fraction of blocks the pattern keeps (over cuDNN's 50.2%).

The grid isolates one change at a time from the default (`KernelTuning()`):
no row split (`max_visits=None`), other splits, Triton's warps and stages,
square blocks of 32 and 128 (the first sweep's other shapes, 4 warps at blocks of 32
and 128, were slower still: docs/benchmarks.md), and query blocks of 128 over key
blocks of 64 with 4 and 8 warps (`block_q=128, block_k=64`: half the programs, each
key block loaded once per 128 queries; `kept_fraction` and the target then count
128 x 64 tiles). `--before FILE` also times an earlier version of the
kernel file (its `block_sparse_attention(..., block=64)`). Every row's
gradients are compared with the default's (max |difference| / max |default|), so
a faster shape that computes something else is seen. Rows are written to
`--out` as they finish; `--budget_s` stops the sweep before the machine's
time runs out; `--tunings` times only the named rows (and the default). GPU
only (`--reference xla --seq_len 512` runs it anywhere, in Pallas interpret
mode, as a smoke test).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from benchmarks import pallas_gpu_cases as cases
from benchmarks.cudnn_cases import dot_product
from benchmarks.sparse_cases import HEAD_DIM
from longformer_jax.attention.core.block_sparse_flash import KernelTuning, block_sparse_attention
from longformer_jax.attention.core.block_sparse_tables import block_tables

CUDNN_CAUSAL_FRACTION = 0.502     # 256 x 256 blocks of 64: the causal half and its diagonal
GRID = [
    ('default', KernelTuning()),
    # Not yet timed on a GPU: second, so that a sweep cut short by --budget_s still has them.
    ('block_128x64_warps_4', KernelTuning(block_q=128, block_k=64)),
    ('block_128x64_warps_8', KernelTuning(block_q=128, block_k=64, num_warps=8)),
    ('no_split', KernelTuning(max_visits=None)),
    ('split_16', KernelTuning(max_visits=16)),
    ('split_8', KernelTuning(max_visits=8)),
    ('stages_1', KernelTuning(num_stages=1)),
    ('stages_3', KernelTuning(num_stages=3)),
    ('warps_8', KernelTuning(num_warps=8)),
    ('block_32_warps_2', KernelTuning(block_q=32, block_k=32, num_warps=2, max_visits=64)),
    ('block_128_warps_8', KernelTuning(block_q=128, block_k=128, num_warps=8, max_visits=16)),
]


def time_calls(fn, args, repeats):
  """(compile + first call seconds, [seconds of each later call])."""
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return first, times


def fwd_bwd(forward):
  return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(forward(q, k, v).astype(jnp.float32)),
                                    argnums=(0, 1, 2)))


def kernel_forward(attention, rule, **kwargs):
  def forward(q, k, v):
    n = q.shape[1]
    segments, valid = jnp.zeros((1, n), jnp.int32), jnp.ones((1, n), bool)
    return attention(q * jnp.asarray(HEAD_DIM ** -0.5, q.dtype), k, v, segments, valid,
                     mask=rule, **kwargs)
  return forward


def load_before(path):
  spec = importlib.util.spec_from_file_location('block_sparse_flash_before', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.block_sparse_attention


def max_difference(a, b):
  """The largest |a - b| / max |b| over the gradients w.r.t. q, k and v."""
  return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32)))
                   / jnp.max(jnp.abs(y.astype(jnp.float32))))
             for x, y in zip(a[1], b[1]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seq_len', type=int, default=16384)
  parser.add_argument('--repeats', type=int, default=10)
  parser.add_argument('--before', default=None)
  parser.add_argument('--budget_s', type=float, default=300.0)
  parser.add_argument('--out', default='block_sparse_tuning.json')
  parser.add_argument('--reference', default='cudnn', choices=('cudnn', 'xla'),
                      help="the causal row's implementation ('xla': a smoke test off a GPU)")
  parser.add_argument('--tunings', default=None,
                      help='comma-separated grid rows to time (default all; the default '
                           'row always runs first, as the gradients\' reference)')
  args = parser.parse_args()
  names = [name for name, _ in GRID]
  chosen = names if args.tunings is None else ['default'] + args.tunings.split(',')
  unknown = sorted(set(chosen) - set(names))
  if unknown:
    parser.error(f'--tunings: {unknown} not in the grid {names}')
  grid = [(name, tuning) for name, tuning in GRID if name in chosen]
  n, started = args.seq_len, time.perf_counter()
  inputs = cases.bf16_inputs(n, jax.random.PRNGKey(0))
  rows = []

  def record(row):
    rows.append(row)
    print(json.dumps(row), flush=True)
    with open(args.out, 'w') as f:
      json.dump({'device': str(jax.devices()[0]), 'jax': jax.__version__, 'seq_len': n,
                 'rows': rows}, f, indent=1)

  def cudnn_row(when):
    first, times = time_calls(fwd_bwd(dot_product(args.reference)), inputs, args.repeats)
    record({'case': f'{args.reference}_causal', 'when': when, 'median_ms': statistics.median(times) * 1e3,
            'min_ms': min(times) * 1e3, 'max_ms': max(times) * 1e3, 'first_s': first})
    return statistics.median(times)

  cudnn = cudnn_row('first')
  patterns = [('strided', cases.strided_rule()), ('bigbird', cases.bigbird_rule(n))]
  references = {}
  plan = [(p, r, name, tuning) for name, tuning in grid[:1] for p, r in patterns]
  if args.before:
    before = load_before(args.before)
    plan += [(p, r, 'before', None) for p, r in patterns]
  plan += [(p, r, name, tuning) for name, tuning in grid[1:] for p, r in patterns]
  for pattern, rule, name, tuning in plan:
    if time.perf_counter() - started > args.budget_s:
      print(f'budget of {args.budget_s:.0f} s spent: stopping before {pattern} {name}')
      break
    if tuning is None:
      forward, blocks = kernel_forward(before, rule, block=64), (64, 64)
    else:
      forward = kernel_forward(block_sparse_attention, rule, tuning=tuning)
      blocks = (tuning.block_q, tuning.block_k)
    kept = block_tables(rule, n, *blocks).kept_fraction
    try:
      fn = fwd_bwd(forward)
      first, times = time_calls(fn, inputs, args.repeats)
      result = fn(*inputs)
    except Exception as error:      # a shape Triton refuses: recorded, the sweep goes on
      record({'case': pattern, 'tuning': name, 'error': f'{type(error).__name__}: {error}'[:400]})
      continue
    if name == 'default':
      references[pattern] = result
    median = statistics.median(times)
    target = 2 * cudnn * kept / CUDNN_CAUSAL_FRACTION
    record({'case': pattern, 'tuning': name,
            'config': None if tuning is None else dataclasses.asdict(tuning), 'kept_fraction': kept,
            'median_ms': median * 1e3, 'min_ms': min(times) * 1e3, 'max_ms': max(times) * 1e3,
            'first_s': first, 'target_ms': target * 1e3, 'over_target': median / target,
            'grad_rel_diff_vs_default': (max_difference(result, references[pattern])
                                    if pattern in references else None)})
  cudnn_row('last')
  print(f'{len(rows)} rows in {time.perf_counter() - started:.0f} s -> {args.out}')


if __name__ == '__main__':
  main()

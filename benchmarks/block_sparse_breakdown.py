"""Where the Pallas block-sparse kernel's forward + backward time goes, call by call (GPU).

    JAX_PLATFORMS=cuda python benchmarks/block_sparse_breakdown.py --out breakdown.json \
        [--seq_len 16384] [--repeats 20]

For the strided and BigBird patterns of `benchmarks/pallas_gpu_cases.py` with the
default `KernelTuning`, the median of `repeats` timed calls of:

- `fwd`, `fwd_bwd`: the whole attention as the layers call it (forward; the
  gradient of sum(out) w.r.t. q, k, v);
- `forward_kernel`, `dq_kernel`, `dkdv_kernel`: each `pallas_call` alone on
  the same inputs (the programs' results unmerged);
- the rest of `fwd_bwd` (delta, the merge of split rows, the casts) is
  `fwd_bwd` minus the three kernels.

cuDNN's causal attention is timed forward and forward + backward beside them;
each kernel's time per visited block is printed against cuDNN's per computed
block (50.2% of the 64 x 64 blocks). `--reference xla --seq_len 512` runs it
anywhere, in Pallas interpret mode, as a smoke test.
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys

import jax
import jax.numpy as jnp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from benchmarks import pallas_gpu_cases as cases
from benchmarks.block_sparse_tuning import (CUDNN_CAUSAL_FRACTION, fwd_bwd, kernel_forward,
                                            time_calls)
from benchmarks.cudnn_cases import dot_product
from benchmarks.sparse_cases import HEAD_DIM
from longformer_jax.attention.core import block_sparse_flash as kernel
from longformer_jax.attention.core.block_sparse_tables import block_tables


def median_ms(fn, args, repeats):
  return statistics.median(time_calls(jax.jit(fn), args, repeats)[1]) * 1e3


def kernel_calls(rule, tuning, q, k, v):
  """The three pallas_calls as functions of (q, k, v), on one document."""
  n = q.shape[1]
  seg = jnp.zeros((1, n), jnp.int32)
  rows, columns, masks = kernel._programs(rule, tuning, n)
  interpret = jax.default_backend() != 'gpu'
  out, lse = kernel._forward(rule, tuning, interpret, q, k, v, seg, seg)
  d_out = jnp.ones_like(out)
  delta = jnp.sum(out.astype(jnp.float32), axis=-1)
  rest = (seg, seg, d_out, lse, delta)

  def forward_kernel(q, k, v):
    return kernel._call(kernel._forward_kernel, rows, masks, tuning, interpret,
                        (q, k, v, seg, seg),
                        [(True, kernel._part_dtype(rows, q.dtype)), (False, jnp.float32)],
                        tuning.block_q)

  def dq_kernel(q, k, v):
    return kernel._call(kernel._dq_kernel, rows, masks, tuning, interpret, (q, k, v) + rest,
                        [(True, kernel._part_dtype(rows, q.dtype))], tuning.block_q)

  def dkdv_kernel(q, k, v):
    return kernel._call(kernel._dkdv_kernel, columns, masks, tuning, interpret,
                        (q, k, v) + rest, [(True, kernel._part_dtype(columns, k.dtype))] * 2,
                        tuning.block_k)

  return {'forward_kernel': forward_kernel, 'dq_kernel': dq_kernel, 'dkdv_kernel': dkdv_kernel}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seq_len', type=int, default=16384)
  parser.add_argument('--repeats', type=int, default=20)
  parser.add_argument('--out', default='block_sparse_breakdown.json')
  parser.add_argument('--reference', default='cudnn', choices=('cudnn', 'xla'))
  args = parser.parse_args()
  n, tuning = args.seq_len, kernel.KernelTuning()
  inputs = cases.bf16_inputs(n, jax.random.PRNGKey(0))
  reference = dot_product(args.reference)
  result = {'device': str(jax.devices()[0]), 'jax': jax.__version__, 'seq_len': n,
            'tuning': dataclasses.asdict(tuning), 'rows': {}}
  result['rows'][f'{args.reference}_causal'] = {
      'fwd': median_ms(reference, inputs, args.repeats),
      'fwd_bwd': median_ms(fwd_bwd(reference), inputs, args.repeats)}
  reference_blocks = CUDNN_CAUSAL_FRACTION * (n // 64) ** 2
  for name, rule in (('strided', cases.strided_rule()), ('bigbird', cases.bigbird_rule(n))):
    forward = kernel_forward(kernel.block_sparse_attention, rule, tuning=tuning)
    row = {'fwd': median_ms(forward, inputs, args.repeats),
           'fwd_bwd': median_ms(fwd_bwd(forward), inputs, args.repeats)}
    scaled = (inputs[0] * jnp.asarray(HEAD_DIM ** -0.5, inputs[0].dtype),) + inputs[1:]
    for call, fn in kernel_calls(rule, tuning, *scaled).items():
      row[call] = median_ms(fn, scaled, args.repeats)
    row['rest'] = row['fwd_bwd'] - row['forward_kernel'] - row['dq_kernel'] - row['dkdv_kernel']
    tables = block_tables(rule, n, tuning.block_q, tuning.block_k)
    visits = int(tables.kv_count.sum()) * inputs[0].shape[2]
    row['visited_blocks'] = visits
    row['us_per_block_fwd_bwd'] = row['fwd_bwd'] * 1e3 / visits
    row['reference_us_per_block_fwd_bwd'] = (
        result['rows'][f'{args.reference}_causal']['fwd_bwd'] * 1e3
        / (reference_blocks * inputs[0].shape[2]))
    result['rows'][name] = row
    print(name, json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
  print(json.dumps(result['rows'][f'{args.reference}_causal']))
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()

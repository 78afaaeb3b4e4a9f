r"""LRA's Table 2 here: training steps per second and peak memory per variant, Text task, 1K-4K.

  python -m benchmarks.lra_cost --scale=mini [--lengths=1024,2048,3072,4096] [--variants=...]
      [--batch_size=8] [--results=benchmarks/results/lra/cost.json]

Every (variant, length) row is measured in its own process (`--one=VARIANT,LENGTH`): the
model of `configs/lra.py:text,VARIANT,SCALE` with `data.seq_len` = LENGTH (documents of
LENGTH - 1 bytes, [CLS] in front), one batch size for all. The process builds the run's
own training task (tasks/example_training.py), compiles its train step, runs `--warmup`
steps, then times `--steps` steps one by one (each waits for its result) and reports the
median rate with the spread (the fastest and slowest step). The float32 2048^3 matmul rate
is measured in the same process before and after. Peak memory is XLA's plan for the
compiled train step (arguments + outputs - donated aliases + temporaries, as
memory_check.py counts it); the process's peak resident memory is given beside it.
Rows give each value relative to vanilla at the same length (when vanilla was measured).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

import jax
import ml_collections

from benchmarks import matmul_rate
from benchmarks.lra_results import merge_rows
from configs import lra
from longformer_jax.experiment_config import resolve_config
from longformer_jax.tasks.registry import task_for

VARIANTS = ('vanilla', 'local', 'longformer', 'bigbird', 'sparse_strided', 'sparse_fixed',
            'reformer', 'performer', 'performer_relu', 'routing', 'etc', 'blockbert',
            'bp_transformer')


def run_config(variant: str, length: int, scale: str, batch_size: int) -> dict:
  """The Text run of `variant` at `length` tokens ([CLS] + length - 1 bytes per document)."""
  config = lra.get_config(f'text,{variant},{scale}', length=length)
  config['data'].update(seq_len=length, batch_size=batch_size, eval_batch_size=batch_size)
  config['data']['lra_text'] = {'min_bytes': length - 1, 'max_bytes': length - 1,
                                'train_examples': 4 * batch_size,
                                'valid_examples': batch_size, 'test_examples': batch_size}
  config['train'].update(eval_every=0)
  return config


def measure_one(variant: str, length: int, scale: str, batch_size: int, warmup: int,
                steps: int) -> dict:
  """One row, measured in this process."""
  config = ml_collections.ConfigDict(resolve_config(run_config(variant, length, scale,
                                                               batch_size)))
  rate_before = matmul_rate.measure().median_flops_per_s
  training = task_for(config.task).training_task(config)
  state = training.enter_segment(training.fresh_state(), 0)
  memory = training.compiled_train_step.memory_analysis()
  for _ in range(warmup):
    state, metrics, _ = training.train_step(state)
  jax.block_until_ready(metrics)
  seconds = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics, _ = training.train_step(state)
    jax.block_until_ready(metrics)
    seconds.append(time.perf_counter() - start)
  rate_after = matmul_rate.measure().median_flops_per_s
  peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes
          - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  return {'variant': variant, 'length': length, 'scale': scale, 'batch_size': batch_size,
          'steps_per_s': round(1.0 / statistics.median(seconds), 4),
          'steps_per_s_spread': [round(1.0 / max(seconds), 4), round(1.0 / min(seconds), 4)],
          'peak_bytes': int(peak),
          'max_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
          'matmul_gflops': [round(rate_before / 1e9, 1), round(rate_after / 1e9, 1)],
          'timed_steps': steps}


def with_ratios(rows: list[dict]) -> list[dict]:
  """`rows` with `relative_steps_per_s` and `relative_peak` against vanilla's row of the same
  length and scale."""
  vanilla = {(r['length'], r['scale']): r for r in rows if r['variant'] == 'vanilla'}
  out = []
  for row in rows:
    base = vanilla.get((row['length'], row['scale']))
    row = dict(row)
    if base:
      row['relative_steps_per_s'] = round(row['steps_per_s'] / base['steps_per_s'], 3)
      row['relative_peak'] = round(row['peak_bytes'] / base['peak_bytes'], 3)
    out.append(row)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini', choices=lra.SCALES)
  parser.add_argument('--lengths', default='1024,2048,3072,4096')
  parser.add_argument('--variants', default=','.join(VARIANTS))
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--steps', type=int, default=7)
  parser.add_argument('--results', default='benchmarks/results/lra/cost.json')
  parser.add_argument('--one', default='', help='VARIANT,LENGTH: measure one row, print it')
  args = parser.parse_args(argv)
  if args.one:
    variant, length = args.one.split(',')
    row = measure_one(variant, int(length), args.scale, args.batch_size, args.warmup,
                      args.steps)
    print('ROW ' + json.dumps(row), flush=True)
    return 0
  failures = 0
  for length in [int(n) for n in args.lengths.split(',')]:
    for variant in [v.strip() for v in args.variants.split(',') if v.strip()]:
      command = [sys.executable, os.path.abspath(__file__), f'--scale={args.scale}',
                 f'--batch_size={args.batch_size}', f'--warmup={args.warmup}',
                 f'--steps={args.steps}', f'--one={variant},{length}']
      done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
      lines = [l for l in done.stdout.splitlines() if l.startswith('ROW ')]
      if done.returncode or not lines:
        failures += 1
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ['no output']
        print(f'{variant} at {length}: exit {done.returncode}: {tail[0]}', flush=True)
        continue
      row = json.loads(lines[-1][4:])
      merged = merge_rows(args.results, [row], ('variant', 'length', 'scale', 'batch_size'))
      merge_rows(args.results, with_ratios(merged), ('variant', 'length', 'scale', 'batch_size'))
      print(json.dumps(row), flush=True)
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())

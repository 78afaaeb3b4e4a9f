"""Time and peak memory of attention variants against sequence length.

  python benchmarks/attention_scaling.py --out attention_scaling.json [--quick] [--variants a,b]

Cases come from every `benchmarks/*_cases.py` (each exports
`CASES: list[AttentionCase]`, see attention_case.py): batch 1, 8 heads of
64, window 512 (or the comparable span), lengths 1k, 2k, 4k, 8k, 16k
(`--quick`: 1k, 2k). For each case, length and mode (`fwd`: forward;
`fwd_bwd`: gradient of sum(out) with respect to every float input) a fresh
subprocess compiles the case, runs it once, then `--repeats` times; it
writes one row:

  variant, seq_len, mode, seconds (median), peak_mib, xla_temp_mib,
  flops, floor_seconds, over_floor, matmul_gflops

- `peak_mib`: the peak resident memory (getrusage ru_maxrss) of a second
  child that compiles and runs the case once under glibc's default malloc,
  minus that of an idle child that imported the same modules: the case's
  own inputs, compilation and run. (Under the timing child's malloc
  settings freed memory is never returned, and fragmentation inflates the
  peak: 3.3 GiB instead of 2.0 GiB for longformer_blocked at 16k.)
  `xla_temp_mib`: XLA's compiled memory_analysis() temporaries (the run's
  working buffers alone).
- `floor_seconds`: the case's own FLOPs (x3 for fwd_bwd: the backward pass
  is twice the forward's matmuls) over the float32 matmul rate measured in
  the same run (benchmarks/matmul_rate.py); `over_floor` = seconds / floor.
- Hugging Face's PyTorch LongformerSelfAttention is timed as a peer when
  torch and transformers import (`hf_longformer_self_attention`, time only);
  rows of `longformer_layer_two_sided` then get `ours_over_peer`.

Timing children run with the glibc malloc settings of
longformer_jax/cpu_malloc.py (faster large XLA CPU runs). Cases longer than their
`max_seq_len` (the dense ones at 16k) are skipped.
"""

import argparse
import glob
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

LENGTHS = (1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (1024, 2048)
MODES = ('fwd', 'fwd_bwd')
PEER = 'hf_longformer_self_attention'
PEER_OF = 'longformer_layer_two_sided'


def case_modules() -> list[str]:
  names = sorted(os.path.basename(p)[:-3]
                 for p in glob.glob(os.path.join(REPO, 'benchmarks', '*_cases.py')))
  return [f'benchmarks.{name}' for name in names]


def all_cases() -> dict:
  cases = {}
  for module in case_modules():
    for case in importlib.import_module(module).CASES:
      cases[case.variant] = case
  return cases


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_case(variant: str, seq_len: int, mode: str, repeats: int) -> dict:
  """In a child process: compile, run once, time `repeats` runs."""
  import jax
  import jax.numpy as jnp
  case = all_cases()[variant]
  inputs = case.make_inputs(seq_len, jax.random.PRNGKey(0))
  if mode == 'fwd':
    fn = case.forward
  else:
    float_args = tuple(i for i, a in enumerate(inputs) if jnp.issubdtype(a.dtype, jnp.floating))
    fn = jax.grad(lambda *a: jnp.sum(case.forward(*a)), argnums=float_args)
  compiled = jax.jit(fn).lower(*inputs).compile()
  analysis = compiled.memory_analysis()
  jax.block_until_ready(compiled(*inputs))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*inputs))
    times.append(time.perf_counter() - start)
  return dict(seconds=statistics.median(times) if times else None, peak_rss_mib=peak_rss_mib(),
              xla_temp_mib=(analysis.temp_size_in_bytes / 2 ** 20) if analysis else None,
              flops=case.flops(seq_len) * (1 if mode == 'fwd' else 3))


def child_main(task: dict) -> dict:
  if task['kind'] == 'idle':
    import jax  # noqa: F401
    all_cases()
    return dict(peak_rss_mib=peak_rss_mib())
  if task['kind'] == 'matmul':
    from benchmarks.matmul_rate import float32_matmul_flops_per_s
    return dict(flops_per_s=float32_matmul_flops_per_s())
  if task['kind'] == 'peer':
    from benchmarks import hf_longformer_peer
    seconds = hf_longformer_peer.time_self_attention(task['seq_len'], task['mode'], task['repeats'])
    return dict(seconds=seconds, peak_rss_mib=peak_rss_mib())
  return run_case(task['variant'], task['seq_len'], task['mode'], task['repeats'])


def in_child(task: dict, timeout: float, malloc_settings: bool = True) -> dict:
  """Runs `task` in a fresh interpreter; returns its result or an `error`."""
  from longformer_jax.cpu_malloc import SETTINGS
  env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
  env.update(SETTINGS if malloc_settings else {},
             JAX_PLATFORMS=os.environ.get('JAX_PLATFORMS', 'cpu'))
  command = [sys.executable, os.path.abspath(__file__), '--child', json.dumps(task)]
  try:
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
  except subprocess.TimeoutExpired:
    return dict(error=f'timeout after {timeout:.0f} s')
  lines = [l for l in done.stdout.splitlines() if l.startswith('{')]
  if done.returncode != 0 or not lines:
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ['no output']
    return dict(error=f'exit {done.returncode}: {tail[0][:300]}')
  return json.loads(lines[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='attention_scaling.json')
  parser.add_argument('--quick', action='store_true', help=f'lengths {QUICK_LENGTHS} only')
  parser.add_argument('--variants', default='', help='comma list of variants (default: all)')
  parser.add_argument('--seq_lens', default='', help='comma list overriding the lengths')
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--timeout', type=float, default=1800.0, help='seconds per case')
  parser.add_argument('--no_peer', action='store_true', help='skip the Hugging Face peer')
  parser.add_argument('--child', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(child_main(json.loads(args.child))), flush=True)
    return

  cases = all_cases()
  wanted = [v for v in args.variants.split(',') if v] or list(cases) + [PEER]
  unknown = sorted(set(wanted) - set(cases) - {PEER})
  if unknown:
    parser.error(f'unknown variants {unknown}; known: {sorted(cases) + [PEER]}')
  lengths = ([int(n) for n in args.seq_lens.split(',')] if args.seq_lens
             else QUICK_LENGTHS if args.quick else LENGTHS)
  modes = [m for m in args.modes.split(',') if m]

  rate = in_child(dict(kind='matmul'), args.timeout)['flops_per_s']
  baseline = in_child(dict(kind='idle'), args.timeout, malloc_settings=False)['peak_rss_mib']
  print(f'float32 matmul: {rate / 1e9:.0f} GFLOP/s; idle child: {baseline:.0f} MiB', flush=True)
  rows = []
  for seq_len in lengths:
    for mode in modes:
      for variant in [v for v in wanted if v in cases]:
        case = cases[variant]
        if seq_len > case.max_seq_len:
          print(f'skip {variant} at {seq_len} (max_seq_len {case.max_seq_len})', flush=True)
          continue
        task = dict(kind='case', variant=variant, seq_len=seq_len, mode=mode)
        result = in_child(dict(task, repeats=args.repeats), args.timeout)
        if 'error' not in result:   # memory: one run under glibc's default malloc
          memory = in_child(dict(task, repeats=0), args.timeout, malloc_settings=False)
          result['peak_rss_mib'] = memory.get('peak_rss_mib', float('nan'))
        row = dict(variant=variant, seq_len=seq_len, mode=mode, matmul_gflops=rate / 1e9)
        if 'error' in result:
          row.update(error=result['error'], seconds=None, peak_mib=None, floor_seconds=None)
        else:
          floor = result['flops'] / rate
          row.update(seconds=result['seconds'], peak_mib=result['peak_rss_mib'] - baseline,
                     xla_temp_mib=result['xla_temp_mib'], flops=result['flops'],
                     floor_seconds=floor, over_floor=result['seconds'] / floor)
        rows.append(row)
        print(json.dumps(row), flush=True)
      if PEER in wanted and not args.no_peer:
        rows += peer_rows(rows, seq_len, mode, args)
  with open(args.out, 'w') as f:
    json.dump(rows, f, indent=1)
  print(f'wrote {len(rows)} rows to {args.out}')


def peer_rows(rows: list, seq_len: int, mode: str, args) -> list:
  """Hugging Face's LongformerSelfAttention at this length and mode, if it imports."""
  from benchmarks import hf_longformer_peer
  reason = hf_longformer_peer.available()
  if reason:
    print(f'skip {PEER}: torch/transformers not importable ({reason})', flush=True)
    return []
  result = in_child(dict(kind='peer', seq_len=seq_len, mode=mode, repeats=args.repeats),
                    args.timeout)
  row = dict(variant=PEER, seq_len=seq_len, mode=mode, peak_mib=None, floor_seconds=None,
             seconds=result.get('seconds'))
  if 'error' in result:
    row['error'] = result['error']
  print(json.dumps(row), flush=True)
  for ours in rows:
    if (ours['variant'], ours['seq_len'], ours['mode']) == (PEER_OF, seq_len, mode) \
        and ours.get('seconds') and row['seconds']:
      ours['ours_over_peer'] = ours['seconds'] / row['seconds']
  return [row]


if __name__ == '__main__':
  main()

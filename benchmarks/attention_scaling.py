"""Time and peak memory of attention variants against sequence length.

  python benchmarks/attention_scaling.py --out attention_scaling.json [--quick] [--variants a,b]
      [--seq_lens ...] [--modes fwd,fwd_bwd] [--repeats N] [--no_peer | --compare]

Cases come from every `benchmarks/*_cases.py` (each exports
`CASES: list[AttentionCase]`, see attention_case.py): batch 1, 8 heads of
64, window 512 (or the comparable span), lengths 1k, 2k, 4k, 8k, 16k
(`--quick`: 1k, 2k). For each case, length and mode (`fwd`: forward;
`fwd_bwd`: gradient of sum(out) with respect to every float input) a fresh
subprocess on the platform JAX_PLATFORMS names (default cpu) compiles the
case, runs it once, measures the float32 matmul rate
(benchmarks/matmul_rate.py), times `--repeats` (>= 3) runs, and measures the
matmul rate again; it writes one row:

  variant, seq_len, mode, device, seconds (median), seconds_min, seconds_max,
  repeats, peak_mib, xla_temp_mib, flops, matmul_gflops_before,
  matmul_gflops_after, matmul_gflops (their mean), floor_seconds, over_floor

- `floor_seconds`: the case's own FLOPs (x3 for fwd_bwd: the backward pass
  is twice the forward's matmuls) over the mean of the two matmul rates
  measured next to the row's timed runs, in the same process, so the floor
  sees the load the runs saw (the rate of a shared CPU moves by 2x with
  load); `over_floor` = seconds / floor.
- `peak_mib`: the peak resident memory (getrusage ru_maxrss) of a second
  child that compiles and runs the case once under glibc's default malloc,
  minus that of an idle child that imported the same modules: the case's
  own inputs, compilation and run. (Under the timing child's malloc
  settings freed memory is never returned, and fragmentation inflates the
  peak: 3.3 GiB instead of 2.0 GiB for longformer_blocked at 16k.)
  `xla_temp_mib`: XLA's compiled memory_analysis() temporaries (the run's
  working buffers alone).
- Hugging Face's PyTorch LongformerSelfAttention is timed as a peer when
  torch and transformers import (`hf_longformer_self_attention`, time only);
  rows of `longformer_layer_two_sided` then get `peer_seconds` and
  `ours_over_peer` (our median over the peer's, same length and mode).
  `--compare` adds both to the variants and prints a table of the ratio;
  without torch/transformers it says so in one line.

The header line names the platform and device. Timing children run with the
glibc malloc settings of longformer_jax/cpu_malloc.py (faster large XLA CPU
runs). Cases longer than their `max_seq_len` (the dense ones at 16k) are
skipped.
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


# ---- Row building: pure functions of the children's results (tested on fake timings).

def spread(times: list) -> dict:
  """`seconds` (the median), `seconds_min`, `seconds_max` and `repeats` of timed runs."""
  if not times:
    return dict(seconds=None, seconds_min=None, seconds_max=None, repeats=0)
  return dict(seconds=statistics.median(times), seconds_min=min(times), seconds_max=max(times),
              repeats=len(times))


def case_row(variant: str, seq_len: int, mode: str, result: dict, idle_mib: float) -> dict:
  """One row from a timing child's `result` (with `peak_rss_mib` of the memory child).

  The floor is the case's FLOPs over the mean of the matmul rates measured
  right before and right after its timed runs, in the same child.
  """
  row = dict(variant=variant, seq_len=seq_len, mode=mode, device=result.get('device'))
  if 'error' in result:
    row.update(error=result['error'], seconds=None, peak_mib=None, floor_seconds=None,
               over_floor=None)
    return row
  before, after = result['flops_per_s_before'], result['flops_per_s_after']
  rate = (before + after) / 2.0
  row.update(spread(result['times']))
  floor = result['flops'] / rate
  peak = result.get('peak_rss_mib')
  row.update(peak_mib=None if peak is None else peak - idle_mib,
             xla_temp_mib=result['xla_temp_mib'], flops=result['flops'], matmul_gflops_before=before / 1e9,
             matmul_gflops_after=after / 1e9, matmul_gflops=rate / 1e9, floor_seconds=floor,
             over_floor=row['seconds'] / floor)
  return row


def attach_peer_ratios(rows: list) -> list:
  """Sets `peer_seconds` and `ours_over_peer` on every `PEER_OF` row that has a peer row of
  the same length and mode (None where either time is missing); returns those rows."""
  peers = {(r['seq_len'], r['mode']): r for r in rows if r['variant'] == PEER}
  compared = []
  for row in rows:
    peer = peers.get((row['seq_len'], row['mode']))
    if row['variant'] != PEER_OF or peer is None:
      continue
    ok = bool(row.get('seconds')) and bool(peer.get('seconds'))
    row.update(peer_seconds=peer.get('seconds'),
               ours_over_peer=row['seconds'] / peer['seconds'] if ok else None)
    compared.append(row)
  return compared


def comparison_table(compared: list) -> str:
  """Our median time over the peer's, one line per length and mode."""
  lines = [f'{"seq_len":>8} {"mode":8} {PEER_OF + " s":>32} {PEER + " s":>34} {"ours_over_peer":>15}']
  for row in compared:
    ratio, ours, peer = row.get('ours_over_peer'), row.get('seconds'), row.get('peer_seconds')
    lines.append(f'{row["seq_len"]:>8} {row["mode"]:8} '
                 f'{"-" if ours is None else f"{ours:.4f}":>32} '
                 f'{"-" if peer is None else f"{peer:.4f}":>34} '
                 f'{"-" if ratio is None else f"{ratio:.2f}":>15}')
  return '\n'.join(lines)


def header_line(jax_platforms: str, device: str, device_count: int) -> str:
  return f'platform: JAX_PLATFORMS={jax_platforms}; device: {device} x{device_count}'


# ---- Children: each runs in a fresh interpreter.

def device_name() -> str:
  import jax
  device = jax.devices()[0]
  return f'{device.platform}:{device.device_kind}'


def run_case(variant: str, seq_len: int, mode: str, repeats: int) -> dict:
  """In a child process: compile, run once, then (if `repeats`) the matmul rate, `repeats`
  timed runs and the matmul rate again, so the rates see the load the runs saw."""
  import jax
  import jax.numpy as jnp
  from benchmarks.matmul_rate import measure
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
  result = dict(peak_rss_mib=peak_rss_mib(), device=device_name(),
                xla_temp_mib=(analysis.temp_size_in_bytes / 2 ** 20) if analysis else None,
                flops=case.flops(seq_len) * (1 if mode == 'fwd' else 3))
  if not repeats:
    return result
  before = measure().best_flops_per_s
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*inputs))
    times.append(time.perf_counter() - start)
  after = measure().best_flops_per_s
  return dict(result, times=times, flops_per_s_before=before, flops_per_s_after=after)


def child_main(task: dict) -> dict:
  if task['kind'] == 'idle':
    import jax
    all_cases()
    idle_mib = peak_rss_mib()   # before the backend starts, as in the case children's baseline
    return dict(peak_rss_mib=idle_mib, device=device_name(), device_count=jax.device_count())
  if task['kind'] == 'peer':
    from benchmarks import hf_longformer_peer
    times = hf_longformer_peer.self_attention_times(task['seq_len'], task['mode'],
                                                    task['repeats'])
    return dict(times=times, peak_rss_mib=peak_rss_mib())
  return run_case(task['variant'], task['seq_len'], task['mode'], task['repeats'])


def in_child(task: dict, timeout: float, malloc_settings: bool = True) -> dict:
  """Runs `task` in a fresh interpreter; returns its result or an `error`."""
  from longformer_jax.cpu_malloc import SETTINGS
  env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
  env.update(SETTINGS if malloc_settings else {}, JAX_PLATFORMS=jax_platforms())
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


def jax_platforms() -> str:
  return os.environ.get('JAX_PLATFORMS', 'cpu')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='attention_scaling.json')
  parser.add_argument('--quick', action='store_true', help=f'lengths {QUICK_LENGTHS} only')
  parser.add_argument('--variants', default='', help='comma list of variants (default: all)')
  parser.add_argument('--seq_lens', default='', help='comma list overriding the lengths')
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--repeats', type=int, default=3, help='timed runs per row (at least 3)')
  parser.add_argument('--timeout', type=float, default=1800.0, help='seconds per case')
  parser.add_argument('--no_peer', action='store_true', help='skip the Hugging Face peer')
  parser.add_argument('--no_host_peak', action='store_true',
                      help='skip the memory child (peak_mib None): on a GPU the host peak says '
                           'little and the second child doubles the time')
  parser.add_argument('--compare', action='store_true',
                      help=f'also run {PEER_OF} and {PEER}; print ours over the peer')
  parser.add_argument('--child', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(child_main(json.loads(args.child))), flush=True)
    return
  if args.repeats < 3:
    parser.error(f'--repeats must be at least 3 (the row reports min, median, max), got {args.repeats}')
  if args.compare and args.no_peer:
    parser.error('--compare needs the peer: drop --no_peer')

  cases = all_cases()
  wanted = [v for v in args.variants.split(',') if v] or list(cases) + [PEER]
  if args.compare:
    wanted += [v for v in (PEER_OF, PEER) if v not in wanted]
  unknown = sorted(set(wanted) - set(cases) - {PEER})
  if unknown:
    parser.error(f'unknown variants {unknown}; known: {sorted(cases) + [PEER]}')
  lengths = ([int(n) for n in args.seq_lens.split(',')] if args.seq_lens
             else QUICK_LENGTHS if args.quick else LENGTHS)
  modes = [m for m in args.modes.split(',') if m]
  run_peer = PEER in wanted and not args.no_peer
  peer_missing = ''
  if run_peer:
    from benchmarks import hf_longformer_peer
    peer_missing = hf_longformer_peer.available()
    if peer_missing:
      print(f'no peer: {PEER} skipped, torch/transformers do not import ({peer_missing})',
            flush=True)

  idle = in_child(dict(kind='idle'), args.timeout, malloc_settings=False)
  if 'error' in idle:
    sys.exit(f'attention_scaling: the idle child failed: {idle["error"]}')
  print(header_line(jax_platforms(), idle['device'], idle['device_count']) +
        f'; idle child: {idle["peak_rss_mib"]:.0f} MiB', flush=True)
  rows = []
  for seq_len in lengths:
    for mode in modes:
      for variant in [v for v in wanted if v in cases]:
        if seq_len > cases[variant].max_seq_len:
          print(f'skip {variant} at {seq_len} (max_seq_len {cases[variant].max_seq_len})',
                flush=True)
          continue
        task = dict(kind='case', variant=variant, seq_len=seq_len, mode=mode)
        result = in_child(dict(task, repeats=args.repeats), args.timeout)
        if args.no_host_peak:
          result['peak_rss_mib'] = None
        elif 'error' not in result:   # memory: one run under glibc's default malloc
          memory = in_child(dict(task, repeats=0), args.timeout, malloc_settings=False)
          result['peak_rss_mib'] = memory.get('peak_rss_mib', float('nan'))
        rows.append(case_row(variant, seq_len, mode, result, idle['peak_rss_mib']))
        print(json.dumps(rows[-1]), flush=True)
      if run_peer and not peer_missing:
        rows.append(peer_row(seq_len, mode, args))
        print(json.dumps(rows[-1]), flush=True)
  compared = attach_peer_ratios(rows)
  if args.compare and not peer_missing:   # a missing peer was said in one line above
    print(comparison_table(compared), flush=True)
  with open(args.out, 'w') as f:
    json.dump(rows, f, indent=1)
  print(f'wrote {len(rows)} rows to {args.out}')


def peer_row(seq_len: int, mode: str, args) -> dict:
  """Hugging Face's LongformerSelfAttention at this length and mode (time only)."""
  result = in_child(dict(kind='peer', seq_len=seq_len, mode=mode, repeats=args.repeats),
                    args.timeout)
  row = dict(variant=PEER, seq_len=seq_len, mode=mode, device='cpu:torch', peak_mib=None,
             floor_seconds=None)
  if 'error' in result:
    row.update(error=result['error'], seconds=None)
  else:
    row.update(spread(result['times']))
  return row


if __name__ == '__main__':
  main()

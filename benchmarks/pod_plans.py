"""Pod plans checked by the compiler: per-chip bytes, FLOPs and sharding of a train step.

  python -m benchmarks.pod_plans [--plans=xl_1b_v5p128,...] [--out=benchmarks/results/pod_plans.json]
  python -m benchmarks.pod_plans --table      # the rows of --out as docs/scaling.md's table

Each plan is a config (configs/pod_xl.py, pod_longformer.py, pod_bigbird.py) and a TPU slice
(configs/pod_sizes.py). In a fresh process with as many fake CPU devices as the slice
has chips (`--xla_force_host_platform_device_count`), the plan's train step is built on
the config's mesh exactly as training builds it (`memory_check.phase_steps`: shardings,
donation, activation sharding rules) and compiled, never run. A row holds:

- per-device bytes from XLA's `memory_analysis()` of the compiled program (arguments,
  temporaries, total as memory_check.py sums it) against the chip's HBM, and whether
  10% of the HBM is left;
- the program's matmul FLOPs (`program_flops.py`: the jaxpr, scans unrolled, the
  backward pass's recomputation included) and the model FLOPs, the same count for the
  step with `remat_policy='none'` (every matmul the step needs, once);
- the best-case step time, program FLOPs per chip over the chip's bfloat16 peak, and the
  MFU bound, model over program FLOPs (what MFU would be if every matmul ran at peak);
- the sharding of the largest state arrays, read from the compiled program's input
  shardings: global shape, `PartitionSpec`, and the shape each device holds; the largest
  arrays the partitioned program materialises (per device: shape and producing op); and
  how many collectives of each kind it issues.

These are the CPU compiler's figures for the TPU's mesh; docs/scaling.md ("Pod plans")
says where a TPU's compiler would differ. Rows are merged into `--out` by plan.
"""

import argparse
import ast
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

PLANS = {
    **{f'xl_{name}': f'configs/pod_xl.py:{name}'
       for name in ('1b_v5p128', '1b_v5e256', '8b_v5p128', '8b_v5e256')},
    **{f'longformer_{name}': f'configs/pod_longformer.py:{name}'
       for name in ('1b_32k_v5p128', '1b_32k_v5e256', '1b_131k_v5p128', '1b_131k_v5e256',
                    '8b_32k_v5p128', '8b_32k_v5e256', '8b_131k_v5p128', '8b_131k_v5e256')},
    **{f'bigbird_{name}': f'configs/pod_bigbird.py:{name}'
       for name in ('1b_32k_v5p128', '1b_32k_v5e256')},
}
LARGEST = 6
COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'collective-permute', 'all-to-all')
DEFAULT_OUT = 'benchmarks/results/pod_plans.json'


def slice_of(config_spec: str) -> str:
  """The slice a plan is for: the last `_`-separated part of its preset name."""
  return config_spec.rsplit('_', 1)[-1]


def _path_name(path) -> str:
  return '/'.join(str(getattr(key, 'key', getattr(key, 'name', getattr(key, 'idx', key))))
                  for key in path)


def largest_arrays(abstract_state, shardings, count: int = LARGEST) -> list[dict]:
  """The `count` largest arrays of the state: path, global and per-device shape, spec."""
  import jax  # deferred: the parent process never imports JAX (it only starts children)
  leaves = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
  placed = jax.tree_util.tree_leaves(shardings)
  rows = []
  for (path, leaf), leaf_sharding in zip(leaves, placed):
    size = math.prod(leaf.shape) * leaf.dtype.itemsize
    rows.append({'path': _path_name(path), 'dtype': str(leaf.dtype),
                 'shape': list(leaf.shape), 'bytes': int(size),
                 'spec': str(getattr(leaf_sharding, 'spec', leaf_sharding)),
                 'device_shape': list(leaf_sharding.shard_shape(leaf.shape))})
  rows.sort(key=lambda row: -row['bytes'])
  return rows[:count]


_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2,
                'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8}
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%\S+ = (\w+)\[([\d,]*)\][^ ]* ([\w-]+)\(')


def largest_buffers(hlo_text: str, count: int = 5) -> list[dict]:
  """The largest per-device arrays the compiled program materialises: instructions outside
  fusion bodies (what a fusion computes inside never reaches memory), by shape and producing
  op, with how many instructions produce that shape."""
  seen = {}
  in_fusion = False
  for line in hlo_text.splitlines():
    if line and not line[0].isspace():          # a computation's header or its closing brace
      in_fusion = 'fused' in line.split('(')[0] or 'fusion' in line.split('(')[0]
      continue
    match = _INSTRUCTION.match(line)
    if in_fusion or not match or match.group(1) not in _DTYPE_BYTES:
      continue
    dtype, dims, op = match.groups()
    shape = [int(d) for d in dims.split(',') if d]
    key = (dtype, tuple(shape), op)
    seen[key] = seen.get(key, 0) + 1
  rows = [{'dtype': dtype, 'shape': list(shape), 'op': op, 'instructions': n,
           'bytes': math.prod(shape) * _DTYPE_BYTES[dtype]}
          for (dtype, shape, op), n in seen.items()]
  rows.sort(key=lambda row: -row['bytes'])
  return rows[:count]


def collective_counts(hlo_text: str) -> dict:
  """How many of each collective the compiled (partitioned) program issues, by HLO op name
  (`-start` halves of asynchronous pairs counted, `-done` not)."""
  counts = {}
  for op in COLLECTIVES:
    counts[op] = sum(1 for line in hlo_text.splitlines()
                     if f' {op}(' in line or f' {op}-start(' in line)
  return counts


def measure_plan(name: str, config_spec: str, overrides: tuple = ()) -> dict:
  """Builds, counts and compiles one plan in this process (its devices already faked).

  `overrides`: (key, value) pairs applied to the plan's config (the tests shrink a plan's
  widths and mesh with them)."""
  import jax  # deferred: imported in the child, after XLA_FLAGS fixed the device count
  import memory_check  # deferred: as above
  from benchmarks.program_flops import program_flops  # deferred: as above
  from configs import pod_sizes  # deferred: as above
  from longformer_jax import command_line  # deferred: as above
  from longformer_jax.experiment_config import validate_config  # deferred: as above
  from longformer_jax.parallel import sharding  # deferred: as above

  chip = pod_sizes.SLICES[slice_of(config_spec)]
  config = validate_config(command_line.experiment_config(config_spec, list(overrides)))
  no_remat = validate_config(command_line.experiment_config(
      config_spec, [*overrides, ('model.remat_policy', 'none')]))
  def built(checked):
    """The mesh, the phase's step and its matmul count (`program_flops`)."""
    mesh, (phase_step,) = memory_check.phase_steps(checked, vocab_size=pod_sizes.VOCAB_SIZE)
    with sharding.activation_sharding(mesh, checked.parallel.logical_axis_rules,
                                      checked.parallel):
      return mesh, phase_step, program_flops(phase_step.step, phase_step.state,
                                             phase_step.batch)
  mesh, phase_step, program_count = built(config)       # the step as the plan trains it
  model_count = built(no_remat)[2]                       # every matmul it needs, once
  counts = {'program': program_count, 'model': model_count}
  started = time.perf_counter()
  compiled = memory_check.compile_step(config, mesh, phase_step)
  compile_s = time.perf_counter() - started
  memory = memory_check.step_memory(phase_step, compiled)
  hlo_text = compiled.as_text()
  xla_flops = float((compiled.cost_analysis() or {}).get('flops', 0.0))
  devices = mesh.devices.size
  program, model = counts['program'].matmul_flops, counts['model'].matmul_flops
  params = sum(math.prod(leaf.shape)
               for leaf in jax.tree_util.tree_leaves(phase_step.state.params))
  step_s = program / devices / chip['peak_bf16_flops']
  rows, length = phase_step.batch['inputs'].shape
  return {
      'plan': name, 'config': config_spec, 'overrides': [list(pair) for pair in overrides],
      'chip': chip['chip'], 'devices': devices,
      'backend': jax.default_backend(), 'jax': jax.__version__,
      'mesh': dict(zip(mesh.axis_names, (int(s) for s in mesh.devices.shape))),
      'params': int(params), 'rows': rows, 'tokens_per_row': length,
      'tokens_per_step': rows * length, 'remat_policy': config.model.remat_policy,
      'argument_bytes': memory.argument, 'output_bytes': memory.output,
      'alias_bytes': memory.alias, 'temp_bytes': memory.temp, 'total_bytes': memory.total,
      'hbm_bytes': chip['hbm_bytes'], 'hbm_fraction': memory.total / chip['hbm_bytes'],
      'fits_with_10pct': memory.total <= 0.9 * chip['hbm_bytes'],
      'program_flops': program, 'model_flops': model,
      'xla_cost_analysis_flops_per_device': xla_flops,
      'while_loops': counts['program'].while_loops + counts['model'].while_loops,
      'best_case_step_s': step_s, 'mfu_bound': model / program,
      'best_case_tokens_per_s_per_chip': rows * length / devices / step_s,
      'largest_arrays': largest_arrays(phase_step.state, compiled.input_shardings[0][0]),
      'collectives': collective_counts(hlo_text),
      'largest_buffers': largest_buffers(hlo_text),
      'compile_s': compile_s,
  }


def parse_setting(text: str) -> tuple:
  """'KEY=VALUE' (the value a Python literal, else a string) as a (key, value) override."""
  key, sep, value = text.partition('=')
  if not sep or not key:
    raise ValueError(f'--set {text!r}: expected KEY=VALUE, e.g. parallel.mesh_shape=(1,32,2)')
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value


def run_in_child(name: str, timeout_s: float, overrides: tuple = ()) -> dict:
  """`measure_plan` in a fresh process with the slice's device count; its row or error."""
  from configs import pod_sizes  # deferred: light, but keeps the parent's imports minimal
  devices = pod_sizes.SLICES[slice_of(PLANS[name])]['devices']
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  started = time.perf_counter()
  result = subprocess.run([sys.executable, '-m', 'benchmarks.pod_plans', '--child', name,
                           '--child_overrides', json.dumps([list(o) for o in overrides])],
                          env=env, capture_output=True, text=True, timeout=timeout_s,
                          check=False)
  lines = [line for line in result.stdout.splitlines() if line.startswith('{')]
  if result.returncode != 0 or not lines:
    tail = (result.stderr.strip().splitlines() or ['no output'])[-1]
    return {'plan': name, 'config': PLANS[name], 'error': tail,
            'wall_s': time.perf_counter() - started}
  row = json.loads(lines[-1])
  row['wall_s'] = time.perf_counter() - started
  return row


def row_key(row: dict) -> tuple:
  """A row's identity: its plan and the overrides it ran with (an alternative of the plan)."""
  return row['plan'], json.dumps(row.get('overrides', []))


def merge_rows(path: pathlib.Path, rows: list[dict]) -> list[dict]:
  """`rows` written into the JSON list at `path`, replacing earlier rows of the same plan and
  overrides; the plans as shipped first, in `PLANS` order, then the alternatives."""
  old = json.loads(path.read_text()) if path.exists() else []
  keys = {row_key(row) for row in rows}
  merged = [row for row in old if row_key(row) not in keys] + rows
  order = list(PLANS)
  merged.sort(key=lambda row: (bool(row.get('overrides')),
                               order.index(row['plan']) if row['plan'] in order else len(order)))
  tmp = path.with_suffix('.tmp')
  tmp.write_text(json.dumps(merged, indent=1) + '\n')
  tmp.replace(path)
  return merged


def format_row(row: dict) -> str:
  if 'error' in row:
    return f'{row["plan"]:<28} error: {row["error"]}'
  gb = 1e9
  return (f'{row["plan"]:<28} params {row["params"] / 1e9:5.2f}B  arg {row["argument_bytes"] / gb:6.2f}'
          f'  temp {row["temp_bytes"] / gb:6.2f}  total {row["total_bytes"] / gb:6.2f} GB'
          f' ({row["hbm_fraction"]:.0%} of HBM)  step >= {row["best_case_step_s"]:.2f} s'
          f'  MFU <= {row["mfu_bound"]:.2f}  compile {row["compile_s"]:.0f} s')


def _override_text(key: str, value) -> str:
  """An override as the table shows it: the rules by where they put the parameters' embed."""
  if key == 'parallel.logical_axis_rules':
    return f"embed on {dict((name, axes) for name, axes in value).get('embed')}"
  return f'{key}={value}'


def markdown_table(rows: list[dict]) -> str:
  """The plans side by side (docs/scaling.md, "Pod plans"): GB are 10^9 bytes, as the HBM."""
  lines = ['| plan | chips | mesh (data, fsdp, tensor, sequence) | parameters | tokens per step '
           '| state (arguments) GB | temporaries GB | total GB | of HBM | 10% spare '
           '| best-case step | MFU bound |',
           '|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|']
  for row in rows:
    if 'error' in row:
      lines.append(f'| {row["plan"]} | error: {row["error"]} |')
      continue
    mesh = ', '.join(str(row['mesh'][axis]) for axis in ('data', 'fsdp', 'tensor', 'sequence'))
    changed = ', '.join(_override_text(key, value) for key, value in row.get('overrides', [])
                        if key not in ('parallel.mesh_shape', 'data.batch_size',
                                       'data.eval_batch_size'))
    name = f'{row["plan"]} ({changed})' if changed else row['plan']
    lines.append(
        f'| {name} | {row["devices"]} {row["chip"].split()[-1]} | ({mesh}) '
        f'| {row["params"] / 1e9:.2f}B | {row["rows"]} x {row["tokens_per_row"]:,} '
        f'| {row["argument_bytes"] / 1e9:.2f} | {row["temp_bytes"] / 1e9:.2f} '
        f'| {row["total_bytes"] / 1e9:.2f} | {row["hbm_fraction"]:.0%} '
        f'| {"yes" if row["fits_with_10pct"] else "**no**"} | {row["best_case_step_s"]:.2f} s '
        f'| {row["mfu_bound"]:.2f} |')
  return '\n'.join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--plans', default=','.join(PLANS),
                      help='comma-separated plans: ' + ', '.join(PLANS))
  parser.add_argument('--out', default=DEFAULT_OUT)
  parser.add_argument('--timeout_s', type=float, default=1800)
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='a config override for every plan run, e.g. '
                           "--set='parallel.mesh_shape=(1,32,2)' (the row records it)")
  parser.add_argument('--table', action='store_true',
                      help='print the rows of --out as a markdown table and stop')
  parser.add_argument('--child', default='', help=argparse.SUPPRESS)
  parser.add_argument('--child_overrides', default='[]', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    overrides = tuple(tuple(pair) for pair in json.loads(args.child_overrides))
    print(json.dumps(measure_plan(args.child, PLANS[args.child], overrides)))
    return 0
  if args.table:
    rows = json.loads(pathlib.Path(args.out).read_text())
    print(markdown_table([row for row in rows if not row.get('overrides')]))
    print('\nAlternatives (`--set`):\n')
    print(markdown_table([row for row in rows if row.get('overrides')]))
    return 0
  try:
    overrides = tuple(parse_setting(text) for text in args.set)
  except ValueError as error:
    print(f'error: {error}', file=sys.stderr)
    return 2
  names = [name for name in args.plans.split(',') if name]
  unknown = [name for name in names if name not in PLANS]
  if unknown:
    print(f'error: --plans: unknown {unknown}; choose from {", ".join(PLANS)}', file=sys.stderr)
    return 2
  for name in names:
    row = run_in_child(name, args.timeout_s, overrides)
    row.setdefault('overrides', [list(pair) for pair in overrides])
    merge_rows(pathlib.Path(args.out), [row])
    print(format_row(row), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())

r"""Where a training step's time goes: a profile's XLA ops by kind, from the trace and the HLO.

  XLA_FLAGS="--xla_dump_to=HLO --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.*" \
      python train.py --workdir=W --config.train.profile_steps=21,25 ...
  python -m benchmarks.profile_breakdown --trace=W/profile/train --hlo=HLO --steps=5

Reads the `*.trace.json.gz` that `train.profile_steps` writes (train/profiling.py) and the
optimised HLO text that XLA dumps for the same program (`*jit_train_step*after_optimizations.txt`,
CPU or GPU), and sums the time of every XLA op event of that module by kind:

- attention: ops inside an `attention` module scope (their `op_name` metadata has the path
  segment `/attention/`) except its dense projections (`_projections`, `out`, `query`,
  `key`, `value`, `qkv` scopes), which count as matmuls: the scores, masks, softmax and
  weighted sums, whatever kernel computes them;
- matmul: `dot` / `convolution`, or a fusion that contains one (XNNPACK's on the CPU, cuBLAS
  custom calls on the GPU);
- collective: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute (and
  their start / done halves), send, recv;
- copy: `copy`, `transpose`, `copy-start` / `copy-done`, or a fusion whose root is one
  (layout changes and memory moves);
- other: the rest (elementwise and reduction fusions, the optimizer, loop bookkeeping).

Times are summed over every thread or stream an op ran on, so on a multi-threaded CPU they
add up to more than the wall time; the table gives each kind's share of the op time and the
traced wall time per step (first op start to last op end, over `--steps`).
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys

KINDS = ('attention', 'matmul', 'collective', 'copy', 'other')
COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute',
               'send', 'recv')
COPIES = ('copy', 'transpose', 'copy-start', 'copy-done')
MATMULS = ('dot', 'convolution')
PROJECTION = re.compile(r'/attention/(?:[^"]*/)?(?:[\w.]*_projections|out|query|key|value|qkv)'
                        r'(?:/|$)')
NAME = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*')
OPCODE = re.compile(r'\s*([\w\-]+)\(')
COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')


def instruction(line: str) -> 'tuple[str, str] | None':
  """`(name, opcode)` of an HLO instruction line (its type may be a tuple), else None."""
  match = NAME.match(line)
  if not match:
    return None
  rest = line[match.end():]
  if rest.startswith('('):             # a tuple type: skip to its closing parenthesis
    depth = 0
    for index, char in enumerate(rest):
      depth += {'(': 1, ')': -1}.get(char, 0)
      if depth == 0:
        rest = rest[index + 1:]
        break
  else:
    rest = rest.split(' ', 1)[1] if ' ' in rest else ''
  opcode = OPCODE.match(rest)
  return (match.group(1), opcode.group(1)) if opcode else None


def parse_hlo(text: str) -> dict:
  """`{instruction name: (opcode, op_name, called computation's opcodes, its root opcode)}`."""
  computations = collections.defaultdict(list)     # computation -> [(opcode, is_root)]
  instructions = {}
  current = None
  for line in text.splitlines():
    header = COMPUTATION.match(line)
    if header and '=' not in line.split('{')[0]:
      current = header.group(1)
      continue
    parsed = instruction(line)
    if parsed is None:
      continue
    name, opcode = parsed
    called = re.search(r'calls=%?([\w.\-]+)', line)
    op_name = re.search(r'op_name="([^"]*)"', line)
    instructions[name] = (opcode, op_name.group(1) if op_name else '',
                          called.group(1) if called else None)
    computations[current].append((opcode, line.lstrip().startswith('ROOT')))
  table = {}
  for name, (opcode, op_name, called) in instructions.items():
    inner = computations.get(called, [])
    root = next((op for op, is_root in inner if is_root), opcode)
    table[name] = (opcode, op_name, {op for op, _ in inner}, root)
  return table


def kind_of(opcode: str, op_name: str, inner: set, root: str) -> str:
  """The kind (module docstring) of one instruction."""
  base = opcode.replace('-start', '').replace('-done', '')
  if base in COLLECTIVES or inner & set(COLLECTIVES):
    return 'collective'
  if '/attention/' in op_name and not PROJECTION.search(op_name):
    return 'attention'
  if opcode in MATMULS or inner & set(MATMULS) or (opcode == 'custom-call'
                                                   and 'gemm' in op_name.lower()):
    return 'matmul'
  if opcode in COPIES or root in COPIES:
    return 'copy'
  return 'other'


def op_events(trace_dir: str, module: str) -> list:
  """`[(hlo op name, start us, duration us)]` of the module's op events in the one trace."""
  traces = [path for path in glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'),
                                       recursive=True)]
  if len(traces) != 1:
    raise SystemExit(f'--trace={trace_dir}: expected one *.trace.json.gz below it, found '
                     f'{len(traces)}')
  with gzip.open(traces[0]) as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  found = []
  for event in events:
    args = event.get('args') or {}
    if event.get('ph') == 'X' and 'hlo_op' in args and module in args.get('hlo_module', ''):
      found.append((args['hlo_op'], float(event['ts']), float(event.get('dur', 0.0))))
  return found


def hlo_text(hlo_dir: str, module: str) -> str:
  paths = sorted(glob.glob(os.path.join(hlo_dir, f'*{module}*after_optimizations.txt')))
  if not paths:
    raise SystemExit(f'--hlo={hlo_dir}: no *{module}*after_optimizations.txt (dump it with '
                     f'XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text)')
  with open(paths[-1]) as f:
    return f.read()


def scope_of(op_name: str) -> str:
  """A readable place for an op: its module path (from the model's root module on), marked
  'backward' when it comes from the gradient (`transpose(jvp())`)."""
  path = op_name.split('/')
  start = next((i for i, part in enumerate(path) if part[:1].isupper()), 1)
  place = '/'.join(path[start:])[-70:]
  return ('backward ' if 'transpose(' in op_name else '') + place


def breakdown(events: list, table: dict, steps: int) -> dict:
  """Per kind and per op: milliseconds per step and share of the op time."""
  per_op = collections.Counter()
  for name, _, duration in events:
    per_op[name] += duration
  by_kind = collections.Counter()
  unknown = 0.0
  for name, duration in per_op.items():
    if name not in table:
      unknown += duration
      by_kind['other'] += duration
      continue
    by_kind[kind_of(*table[name])] += duration
  total = sum(per_op.values()) or 1.0
  wall = (max(start + duration for _, start, duration in events)
          - min(start for _, start, _ in events)) if events else 0.0
  return {
      'steps': steps, 'wall_ms_per_step': wall / 1e3 / steps,
      'op_ms_per_step': total / 1e3 / steps,
      'kinds': {kind: {'ms_per_step': by_kind[kind] / 1e3 / steps,
                       'share': by_kind[kind] / total} for kind in KINDS},
      'unmatched_share': unknown / total,
      'top_ops': [{'op': name, 'kind': kind_of(*table[name]) if name in table else 'other',
                   'where': scope_of(table[name][1]) if name in table else '',
                   'ms_per_step': duration / 1e3 / steps, 'share': duration / total}
                  for name, duration in per_op.most_common(12)],
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--trace', required=True, help='the profile folder (W/profile/train)')
  parser.add_argument('--hlo', required=True, help='the XLA dump folder of the same run')
  parser.add_argument('--module', default='jit_train_step')
  parser.add_argument('--steps', type=int, required=True, help='steps the trace holds')
  parser.add_argument('--json', default='', help='also write the breakdown here')
  args = parser.parse_args(argv)
  result = breakdown(op_events(args.trace, args.module),
                     parse_hlo(hlo_text(args.hlo, args.module)), args.steps)
  print(f'{args.module}: {result["wall_ms_per_step"]:.1f} ms per step (traced wall), '
        f'{result["op_ms_per_step"]:.1f} ms of op time summed over threads/streams')
  print('| kind | ms per step | share of op time |\n|---|---:|---:|')
  for kind, row in result['kinds'].items():
    print(f'| {kind} | {row["ms_per_step"]:.1f} | {row["share"]:.1%} |')
  print('\n| op | kind | where | ms per step | share |\n|---|---|---|---:|---:|')
  for row in result['top_ops']:
    print(f'| `{row["op"]}` | {row["kind"]} | {row["where"]} | {row["ms_per_step"]:.1f} | '
          f'{row["share"]:.1%} |')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())

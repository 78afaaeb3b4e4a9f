"""Attendre's exact-match tables (its Tables 2-3, in miniature) from reading-comprehension grids.

Each input is a `passkey_grid.json` that eval.py wrote with `kind=attendre_qa`
(docs/attendre_qa.md). Every memory of a grid becomes one row of
`benchmarks/results/attendre_qa.json`:

  policy      the eviction policy ('fifo', 'lra_max', 'lfa', ...), 'sinks', 'xl', or
              'none' (no memory: each chunk alone)
  kv_memory   the K/V memory's entries (0 for 'none')
  q_memory    the Q memory's queries per layer (the memory's `q_memory_size`; 0: none)
  admission   'score' or 'always' where the memory reads it, else null
  settings    the grid's other memory settings the memory reads ('lfa_gamma', 'top_k',
              'order', 'rope_max_distance', ...), {} for none
  chunk       the evaluation chunk
  em          exact match over every cell (0-1); `em_by_length` per context length
  documents   documents scored; `seed` the grid's document seed; `model` the run scored

    python -m benchmarks.attendre_qa_table GRID.json [GRID.json ...] \\
        --model=NAME [--model=NAME ...] --out=benchmarks/results/attendre_qa.json

prints the rows as a markdown table (policy by memory size, one column per context length)
and writes them, replacing the rows of the same model, policy, K/V and Q memory, admission,
chunk and settings.
"""

import argparse
import json
import os
import sys

import numpy as np

KEY = ('model', 'policy', 'kv_memory', 'q_memory', 'admission', 'chunk', 'settings')
# What a grid's memory entry says besides its settings (evaluation/passkey_grid.py).
DESCRIPTION = ('memory', 'variant', 'policy', 'memory_size', 'q_memory_size', 'chunk',
               'admission', 'heatmap', 'size_key', 'peak_host_bytes', 'peak_host_exact',
               'seconds_per_1k_tokens', 'memory_bytes')
NOT_READ = '-'     # a grid setting the memory does not read


def memory_settings(memory: dict) -> dict:
  """The grid settings a memory reads, besides its admission."""
  return {k: v for k, v in sorted(memory.items()) if k not in DESCRIPTION and v != NOT_READ}


def grid_rows(grid: dict, model: str) -> list[dict]:
  """The rows of one grid (module docstring)."""
  if grid.get('kind') != 'attendre_qa':
    raise ValueError(f'not a reading-comprehension grid (kind {grid.get("kind")!r})')
  rows = []
  for memory in grid['memories']:
    cells = [c for c in grid['cells'] if c['memory'] == memory['memory']]
    # Attendre's memories by their policy; the others ('none', 'xl', 'sinks', 'trained')
    # by the name their label starts with.
    attendre = memory.get('variant') == 'attendre'
    policy = memory['policy'] if attendre else memory['memory'].split(':')[0]
    by_length = {}
    for cell in cells:
      by_length.setdefault(cell['length'], []).append(cell['accuracy'])
    admission = memory.get('admission')
    rows.append(dict(
        model=model, policy=policy,
        kv_memory=0 if policy == 'none' else int(memory.get('memory_size', 0)),
        q_memory=int(memory.get('q_memory_size', 0)), admission=admission if admission not in (None, NOT_READ) else None,
        chunk=int(grid['chunk']), settings=memory_settings(memory),
        em=float(np.mean([c['accuracy'] for c in cells])),
        em_by_length={str(k): float(np.mean(v)) for k, v in sorted(by_length.items())},
        documents=int(sum(c['n'] for c in cells)), seed=int(grid['seed'])))
  return rows


def merge(old: list[dict], new: list[dict]) -> list[dict]:
  """`old` less the rows `new` replaces (same KEY), then `new`, where a later row of `new`
  replaces an earlier one of the same KEY (two grids that scored the same memory)."""
  key = lambda row: tuple(json.dumps(row.get(k, {}) if k == 'settings' else row.get(k),
                                     sort_keys=True) for k in KEY)
  latest = {key(r): r for r in new}
  return [r for r in old if key(r) not in latest] + list(latest.values())


def markdown(rows: list[dict]) -> str:
  lengths = sorted({int(k) for r in rows for k in r['em_by_length']})
  lines = ['| model | policy | K/V memory | Q memory | admission | settings | chunk | '
           + ' | '.join(f'EM at {n:,}' for n in lengths) + ' | EM |',
           '|---|---|---:|---:|---|---|---:|' + '---:|' * (len(lengths) + 1)]
  for r in rows:
    cells = [f"{r['em_by_length'][str(n)]:.2f}" if str(n) in r['em_by_length'] else ''
             for n in lengths]
    settings = ', '.join(f'{k}={v}' for k, v in r.get('settings', {}).items())
    lines.append(f"| {r['model']} | {r['policy']} | {r['kv_memory']:,} | {r['q_memory']:,} | "
                 f"{r['admission'] or ''} | {settings} | {r['chunk']} | " + ' | '.join(cells)
                 + f" | {r['em']:.2f} |")
  return '\n'.join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('grids', nargs='+')
  parser.add_argument('--model', action='append', required=True,
                      help='the run each grid scored (one per grid, or one for all)')
  parser.add_argument('--out', default='benchmarks/results/attendre_qa.json')
  args = parser.parse_args(argv)
  models = args.model * len(args.grids) if len(args.model) == 1 else args.model
  if len(models) != len(args.grids):
    print('error: --model: give one per grid, or one for all', file=sys.stderr)
    return 2
  rows = []
  for path, model in zip(args.grids, models):
    try:
      with open(path, encoding='utf-8') as f:
        rows += grid_rows(json.load(f), model)
    except (OSError, ValueError, KeyError) as error:
      print(f'error: {path}: {error}', file=sys.stderr)
      return 2
  old = []
  if os.path.exists(args.out):
    with open(args.out, encoding='utf-8') as f:
      old = [dict({'settings': {}}, **row) for row in json.load(f)['rows']]   # rows of before
  merged = merge(old, rows)
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out + '.tmp', 'w', encoding='utf-8') as f:
    json.dump({'rows': merged}, f, indent=1)
  os.replace(args.out + '.tmp', args.out)
  print(markdown(merged))
  return 0


if __name__ == '__main__':
  sys.exit(main())

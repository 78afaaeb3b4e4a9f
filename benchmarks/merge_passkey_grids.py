"""One passkey grid from grids of the same checkpoint scored in pieces (e.g. one length each).

  python -m benchmarks.merge_passkey_grids --out=MERGED.json [--heatmap=PNG] A.json B.json ...

Each input is a `passkey_grid.json` as eval.py writes it (evaluation/passkey_grid.py). They
must agree on everything but their lengths: the checkpoint, the corpus, the documents per
cell, the seed, the chunk, the depths and the memories' sizes, and no (memory, length,
depth) cell may appear twice; otherwise the merge stops with one line naming the key.

The merged file has the same format: the lengths joined in order, the cells of all inputs,
and per memory its cost over all of them: `peak_host_bytes` the largest (each input is its
own process), `seconds_per_1k_tokens` the mean of the inputs' weighted by the tokens each
read (documents x length per cell), `memory_bytes` (equal in every input). `--heatmap`
writes the accuracy heat map of the merged grid (one memory) as eval.py draws it.
"""

import argparse
import json
import os
import sys

import numpy as np

from longformer_jax.evaluation.heatmap_png import write_heatmap
from longformer_jax.evaluation.passkey_grid import accuracy_table

# Keys whose values the inputs may differ in (merged below); every other key must be equal.
MERGED_KEYS = ('axes', 'memories', 'cells')


class MergeError(ValueError):
  """Grids that cannot be one grid; the message names the key."""


def _tokens(grid: dict) -> float:
  return float(sum(cell['n'] * cell['length'] for cell in grid['cells']))


def _merged_memories(grids: list[dict]) -> list[dict]:
  """Per memory label its entry, with the cost over all inputs (module docstring)."""
  labels = [m['memory'] for m in grids[0]['memories']]
  out = []
  for index, label in enumerate(labels):
    entries = [grid['memories'][index] for grid in grids]
    weights = np.asarray([_tokens(grid) for grid in grids])
    merged = dict(entries[0])
    for key in set(merged) - {'peak_host_bytes', 'peak_host_exact', 'seconds_per_1k_tokens',
                              'heatmap'}:
      if any(entry.get(key) != merged[key] for entry in entries):
        raise MergeError(f'memory {label}: {key} differs between the grids')
    if 'peak_host_bytes' in merged:
      merged['peak_host_bytes'] = max(entry['peak_host_bytes'] for entry in entries)
      merged['peak_host_exact'] = all(entry['peak_host_exact'] for entry in entries)
    if 'seconds_per_1k_tokens' in merged:
      rates = np.asarray([entry['seconds_per_1k_tokens'] for entry in entries])
      merged['seconds_per_1k_tokens'] = float((rates * weights).sum() / weights.sum())
    out.append(merged)
  return out


def merge(grids: list[dict]) -> dict:
  """The grid of every cell of `grids` (module docstring); raises `MergeError`."""
  if not grids:
    raise MergeError('no grids to merge')
  first = grids[0]
  for grid in grids[1:]:
    for key in sorted(set(first) | set(grid)):
      if key not in MERGED_KEYS and first.get(key) != grid.get(key):
        raise MergeError(f'{key} differs between the grids: {first.get(key)!r} and '
                         f'{grid.get(key)!r}')
    if grid['axes']['depths'] != first['axes']['depths']:
      raise MergeError('axes.depths differs between the grids')
    if [m['memory'] for m in grid['memories']] != [m['memory'] for m in first['memories']]:
      raise MergeError('memories differ between the grids')
  cells, seen = [], set()
  for grid in grids:
    for cell in grid['cells']:
      key = (cell['memory'], cell['length'], cell['depth'])
      if key in seen:
        raise MergeError(f'cell (memory {key[0]}, length {key[1]}, depth {key[2]}) is in two '
                         f'grids')
      seen.add(key)
      cells.append(cell)
  lengths = sorted({length for grid in grids for length in grid['axes']['lengths']})
  return dict(first, axes=dict(first['axes'], lengths=lengths),
              memories=_merged_memories(grids), cells=cells)


def accuracy(grid: dict, label: str) -> np.ndarray:
  """`[depths, lengths]` accuracies of memory `label` in a grid's JSON (NaN where no cell)."""
  return accuracy_table(grid['axes']['depths'], grid['axes']['lengths'], grid['cells'], label)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('grids', nargs='+', help='passkey_grid.json files')
  parser.add_argument('--out', required=True, help='the merged JSON')
  parser.add_argument('--heatmap', help='PNG of the merged grid (one memory)')
  args = parser.parse_args(argv)
  try:
    grids = []
    for path in args.grids:
      with open(path) as f:
        grids.append(json.load(f))
    merged = merge(grids)
    if args.heatmap and len(merged['memories']) != 1:
      raise MergeError(f'--heatmap draws one memory; the grids have '
                       f'{len(merged["memories"])}')
  except (OSError, json.JSONDecodeError, KeyError, MergeError) as e:
    print(f'merge_passkey_grids: {e}', file=sys.stderr)
    return 2
  if args.heatmap:
    merged['memories'][0]['heatmap'] = os.path.basename(args.heatmap)
  with open(args.out, 'w') as f:
    json.dump(merged, f, indent=2)
  if args.heatmap:
    write_heatmap(args.heatmap, accuracy(merged, merged['memories'][0]['memory']))
  print(f'{args.out}: {len(merged["cells"])} cells, lengths {merged["axes"]["lengths"]}')
  return 0


if __name__ == '__main__':
  sys.exit(main())

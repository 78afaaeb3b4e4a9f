"""The LRA result files (benchmarks/results/lra/*.json): rows merged by key, written whole.

A file holds a JSON list of rows. `merge_rows` replaces the rows that share a key with a new
one and keeps the others, sorted by key; it writes a temporary file beside the target and
renames it, so a crash never leaves a half-written file.
"""

import json
import os

# The key of an accuracy row (accuracy.json). `settings` is absent (None) on a row of the
# variant's own config and names the overrides of a fair try (benchmarks/lra_table.py).
ACCURACY_KEY = ('task', 'variant', 'scale', 'seed', 'settings', 'pretrain_steps')


def is_own_config(row: dict) -> bool:
  """A row of the variant's own config: no fair-try settings, no self-pretraining."""
  return not row.get('settings') and not row.get('pretrain_steps')


def read_rows(path: str) -> list[dict]:
  """The rows of `path` ([] if it does not exist)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = json.load(f)
  if not isinstance(rows, list):
    raise ValueError(f'{path}: expected a JSON list of rows')
  return rows


def merge_rows(path: str, rows: list[dict], key: tuple) -> list[dict]:
  """Writes `path` with `rows` in place of the rows that share their `key` fields; returns
  the merged rows."""
  def key_of(row):
    return tuple(str(row.get(name)) for name in key)

  merged = {key_of(row): row for row in read_rows(path)}
  merged.update({key_of(row): row for row in rows})
  ordered = [merged[k] for k in sorted(merged)]
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  temporary = f'{path}.tmp'
  with open(temporary, 'w') as f:
    json.dump(ordered, f, indent=1)
    f.write('\n')
  os.replace(temporary, path)
  return ordered

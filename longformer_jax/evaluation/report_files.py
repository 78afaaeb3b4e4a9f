"""The files eval.py writes in `workdir/eval`, and clearing them before a new evaluation.

Every evaluation replaces the whole report of the previous one: the files
below are eval.py's own outputs (and nothing else in `eval/` is touched), so
removing them first leaves no plot or table of an earlier evaluation next
to the new ones (a one-mem_len evaluation after a sweep over several leaves
no `bits_per_byte_vs_mem_len.png`).
"""

import os
import re

EVAL_DIR = 'eval'
OUTPUT_NAMES = (
    'metrics.json',                      # every evaluation: its result
    'bits_per_byte_vs_mem_len.png',      # language models, several mem_lens
    'spans.json', 'spans.png',           # Adaptive-Span models
    'memory_sweep.json', 'memory_sweep.md', 'memory_sweep.png',
    'memory_sweep_far.png',              # eval.memory_sweep
    'passkey_grid.json',                 # eval.passkey_grid (and OUTPUT_PATTERN's heat maps)
)
OUTPUT_PATTERN = re.compile(r'passkey_grid_[A-Za-z0-9_]+\.png')   # one heat map per memory


def fresh_output_dir(workdir: str) -> str:
  """`workdir/eval`, created, without the outputs of an earlier evaluation; returns its path."""
  out_dir = os.path.join(workdir, EVAL_DIR)
  os.makedirs(out_dir, exist_ok=True)
  for name in os.listdir(out_dir):
    path = os.path.join(out_dir, name)
    if (name in OUTPUT_NAMES or OUTPUT_PATTERN.fullmatch(name)) and os.path.isfile(path):
      os.remove(path)
  return out_dir

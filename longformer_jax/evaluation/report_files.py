"""The files eval.py writes in `workdir/eval`, and clearing them before a new evaluation.

Every evaluation replaces the whole report of the previous one: the files
below are eval.py's own outputs (and nothing else in `eval/` is touched), so
removing them first leaves no plot or table of an earlier evaluation next
to the new ones (a one-mem_len evaluation after a sweep over several leaves
no `bits_per_byte_vs_mem_len.png`).

For a `gs://` workdir the report is written to a local folder (plots and
tables are written by libraries that take local paths) and uploaded into
`workdir/eval` when it is complete.
"""

import contextlib
import os
import re
import tempfile
from typing import Iterator

from longformer_jax.storage import paths

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


@contextlib.contextmanager
def fresh_output_dir(workdir: str) -> Iterator[str]:
  """Yields the local folder to write the report in; `workdir/eval` holds it afterwards.

  The outputs of an earlier evaluation are removed from `workdir/eval` first.
  On disk the folder is `workdir/eval` itself; for a `gs://` workdir it is a
  temporary folder whose files are uploaded when the block ends without error.
  """
  target = paths.as_path(workdir) / EVAL_DIR
  target.mkdir(parents=True, exist_ok=True)
  for child in target.iterdir() if target.exists() else ():   # GCS has no empty folders
    if (child.name in OUTPUT_NAMES or OUTPUT_PATTERN.fullmatch(child.name)) and child.is_file():
      child.unlink()
  if not paths.is_remote(target):
    yield os.fspath(target)
    return
  with tempfile.TemporaryDirectory(prefix='eval_report_') as local:
    yield local
    for name in sorted(os.listdir(local)):
      with open(os.path.join(local, name), 'rb') as f:
        (target / name).write_bytes(f.read())

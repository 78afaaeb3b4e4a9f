"""Writing training metrics to disk and showing progress on the console.

`MetricsLogger` appends one JSON object per `write` to `workdir/metrics.jsonl`
(easy to read with `pandas.read_json(path, lines=True)`) and writes the same
scalars to TensorBoard event files in `workdir/tensorboard`. A run resumed
from the checkpoint of step s passes `resume_step=s`: the lines of later
steps (logged by the earlier run after its last checkpoint, and about to be
logged again) are dropped and TensorBoard purges its events past s.

`ProgressBar` shows step, loss, (for language models) bits per token, the
throughput (tok/s or ex/s) and the remaining time. On a terminal it is a
tqdm bar; when stdout is not a terminal (CI logs, `nohup`, pipes) it prints
one short plain line per update instead. `note(line)` prints a line (a
validation result) without breaking the bar.

In multi-host runs, create both with `enabled=jax.process_index() == 0`.

A `gs://` workdir takes the same calls: an object cannot be appended to, so
both files grow in a local folder and are uploaded whole (at most every
`REMOTE_UPLOAD_SECONDS`, with each checkpoint (`flush`) and at `close`); a
resumed run drops the lines past its checkpoint in any case, so lines lost to
a kill are logged again. Given the run's `StorageBound` (checkpoint/storage_bound.py),
each upload ends within `checkpoint.storage_timeout_s`, transient failures retried;
`close(upload=False)` after the storage failed skips the last upload.
"""

import datetime
import importlib
import json
import math
import os
import sys
import tempfile
import time
from typing import Any, TextIO

import tqdm

from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.storage import paths

_RESERVED_KEYS = ('step', 'split')
REMOTE_UPLOAD_SECONDS = 10.0


class MetricsLogger:
  """Writes scalar metrics to `metrics.jsonl` and TensorBoard."""

  def __init__(self, workdir: str, *, enabled: bool = True,
               resume_step: int | None = None, bound: StorageBound | None = None):
    """Opens the files of `workdir` for appending.

    Args:
      workdir: the run's directory.
      enabled: False on every process but the first of a multi-host run.
      resume_step: the step training continues from (0 for a fresh start);
        lines of later steps are dropped first. None keeps every line.
      bound: the run's storage bound for the uploads of a `gs://` workdir (None: each
        upload takes as long as its client's retries).
    """
    self._enabled = enabled
    self._workdir = workdir
    self._bound = bound
    self._jsonl = None
    self._tensorboard = None
    self._staging = None
    if enabled:
      workdir = paths.as_path(workdir)
      workdir.mkdir(parents=True, exist_ok=True)
      self._jsonl_path = workdir / 'metrics.jsonl'
      self._tensorboard_path = workdir / 'tensorboard'
      purge_step = None
      if resume_step is not None:
        _drop_lines_after(self._jsonl_path, int(resume_step))
        purge_step = int(resume_step) + 1
      jsonl, tensorboard = self._jsonl_path, self._tensorboard_path
      if paths.is_remote(workdir):
        # Objects cannot be appended to: both files grow in a local folder and are
        # uploaded whole (TensorBoard's own GCS writer re-uploads from its finalizer,
        # after the run and possibly after the network is gone).
        self._staging = tempfile.TemporaryDirectory(prefix='metrics_')
        jsonl = paths.as_path(self._staging.name) / 'metrics.jsonl'
        tensorboard = paths.as_path(self._staging.name) / 'tensorboard'
        if self._jsonl_path.exists():
          jsonl.write_text(self._jsonl_path.read_text(encoding='utf-8'), encoding='utf-8')
        self._uploaded_at = -math.inf
      self._jsonl = open(jsonl, 'a', encoding='utf-8')
      self._tensorboard = _tensorboard_x().SummaryWriter(logdir=os.fspath(tensorboard),
                                                     purge_step=purge_step)

  def write(
      self, step: int, metrics: dict[str, float], prefix: str = 'train'
  ) -> None:
    """Records `metrics` of `step` under the split name `prefix`.

    Values may be Python, NumPy or JAX scalars. Non-finite values go to
    TensorBoard as they are and to JSON as the strings "nan", "inf", "-inf"
    (`float()` reads them back).
    """
    if not self._enabled:
      return
    clashing = [key for key in metrics if key in _RESERVED_KEYS]
    if clashing:
      raise ValueError(f'Metric names {clashing} are reserved.')
    step = int(step)
    values = {name: _to_number(value) for name, value in metrics.items()}
    record = {'step': step, 'split': prefix}
    record.update({name: _json_number(v) for name, v in values.items()})
    self._jsonl.write(json.dumps(record, allow_nan=False) + '\n')
    self._jsonl.flush()
    for name, value in values.items():
      self._tensorboard.add_scalar(f'{prefix}/{name}', value, step)
    self._tensorboard.flush()
    if self._staging and time.monotonic() - self._uploaded_at >= REMOTE_UPLOAD_SECONDS:
      self._upload()

  def flush(self) -> None:
    """Makes every line written so far durable (on GCS: uploads now). The loop calls it
    with each checkpoint, so a run resumed from that checkpoint has all its steps' lines."""
    if self._staging:
      self._upload()

  def _upload(self) -> None:
    """Copies the staged files of a gs:// workdir over their objects, within the bound."""
    if self._bound is None:
      self._copy_staged()
    else:
      self._bound.call('uploading metrics.jsonl and TensorBoard events to', self._workdir,
                       self._copy_staged, retry=True)

  def _copy_staged(self) -> None:
    """Copies the staged files over their objects (each whole: may run twice)."""
    staged = paths.as_path(self._staging.name)
    self._jsonl_path.write_bytes((staged / 'metrics.jsonl').read_bytes())
    self._tensorboard_path.mkdir(parents=True, exist_ok=True)
    for event_file in (staged / 'tensorboard').iterdir():
      (self._tensorboard_path / event_file.name).write_bytes(event_file.read_bytes())
    self._uploaded_at = time.monotonic()

  def close(self, upload: bool = True) -> None:
    """Flushes and closes the files (a `gs://` workdir's uploaded a last time, unless
    `upload` is False: the storage failed); later writes are errors."""
    if self._jsonl is not None:
      self._jsonl.close()
      self._tensorboard.close()
      self._jsonl = None
      self._tensorboard = None
      if self._staging:
        try:
          if upload:
            self._upload()
        finally:
          self._staging.cleanup()
          self._staging = None

  def __enter__(self) -> 'MetricsLogger':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _drop_lines_after(path, step: int) -> None:
  """Rewrites `path` (atomically) without the lines of steps after `step`."""
  if not path.exists():
    return
  lines = path.read_text(encoding='utf-8').splitlines(keepends=True)
  kept = [line for line in lines
          if line.strip() and json.loads(line)['step'] <= step]
  if len(kept) == len(lines):
    return
  paths.write_text_atomically(path, ''.join(kept))


class ProgressBar:
  """Console progress of training: step/total, loss, [bits/token], rate, ETA.

  `total_steps` is where this run stops (`train.stop_after_steps` when set),
  so the remaining time is the time to that step. It is measured from the
  first `update` on, so the slow first step (compilation) does not distort
  it.
  """

  def __init__(
      self,
      total_steps: int,
      initial_step: int = 0,
      *,
      enabled: bool = True,
      stream: TextIO | None = None,
  ):
    self._total = int(total_steps)
    self._enabled = enabled
    self._stream = stream if stream is not None else sys.stdout
    self._eta = _EtaEstimator(self._total)
    self._bar = None
    if enabled and _is_terminal(self._stream):
      self._bar = tqdm.tqdm(
          total=self._total,
          initial=int(initial_step),
          file=self._stream,
          dynamic_ncols=True,
          bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} {postfix}',
      )

  def update(
      self,
      step: int,
      loss: float,
      rate: float,
      unit: str = 'tok',
      bits_per_token: float | None = None,
  ) -> None:
    """Shows that training has finished `step` with these numbers.

    Args:
      step: the number of finished steps.
      loss: the training loss of the step.
      rate: throughput, in `unit`s per second.
      unit: 'tok' (language models) or 'ex' (examples, encoder tasks).
      bits_per_token: shown when given (language models).
    """
    if not self._enabled:
      return
    step = int(step)
    remaining = self._eta.remaining_seconds(step, time.monotonic())
    bits = ('' if bits_per_token is None
            else f' bits/tok {float(bits_per_token):.4f} |')
    stats = (
        f'loss {float(loss):.4f} |{bits}'
        f' {_format_rate(float(rate))} {unit}/s |'
        f' ETA {_format_duration(remaining)}'
    )
    if self._bar is not None:
      self._bar.update(step - self._bar.n)
      self._bar.set_postfix_str(stats)
    else:
      print(f'step {step}/{self._total} | {stats}', file=self._stream,
            flush=True)

  def note(self, line: str) -> None:
    """Prints `line` on its own (above the bar on a terminal)."""
    if not self._enabled:
      return
    if self._bar is not None:
      self._bar.write(line, file=self._stream)
    else:
      print(line, file=self._stream, flush=True)

  def close(self) -> None:
    """Ends the bar (a no-op for plain-line output)."""
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> 'ProgressBar':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class _EtaEstimator:
  """Remaining time from the step rate since the first update."""

  def __init__(self, total_steps: int):
    self._total = total_steps
    self._first = None  # (step, time) of the first update.

  def remaining_seconds(self, step: int, now: float) -> float | None:
    """Seconds until `total_steps`, or None while the rate is unknown."""
    if self._first is None:
      self._first = (step, now)
      return None
    first_step, first_time = self._first
    if step <= first_step or now <= first_time:
      return None
    seconds_per_step = (now - first_time) / (step - first_step)
    return max(self._total - step, 0) * seconds_per_step


def _is_terminal(stream: TextIO) -> bool:
  isatty = getattr(stream, 'isatty', None)
  try:
    return bool(isatty and isatty())
  except ValueError:  # A closed stream.
    return False


def _to_number(value: Any) -> float | int:
  """A Python int (for integer types) or float from a numeric scalar."""
  if isinstance(value, bool):
    return int(value)
  if isinstance(value, int):
    return value
  if hasattr(value, 'dtype') and value.dtype.kind in 'iub':
    return int(value)
  return float(value)


def _json_number(value: float | int) -> float | int | str:
  """`value`, or its name ("nan", "inf", "-inf") when it is not finite."""
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def _format_rate(per_second: float) -> str:
  """A short human-readable rate such as 950, 12.3k or 1.20M."""
  if not math.isfinite(per_second):
    return str(per_second)
  units = ((1e9, 'G', 2), (1e6, 'M', 2), (1e3, 'k', 1))
  for threshold, suffix, digits in units:
    if abs(per_second) >= threshold:
      return f'{per_second / threshold:.{digits}f}{suffix}'
  return f'{per_second:.0f}'


def _format_duration(seconds: float | None) -> str:
  """H:MM:SS (or '?' when unknown)."""
  if seconds is None or not math.isfinite(seconds):
    return '?'
  return str(datetime.timedelta(seconds=round(seconds)))


def _tensorboard_x():
  """tensorboardX, imported without PyTorch.

  tensorboardX imports PyTorch where it is installed, only to accept torch tensors as
  values (a second or more, with CUDA's libraries several); the scalars written here are
  floats. Unless the process has imported PyTorch already, the import is answered
  "not installed" while tensorboardX loads (tests/train/test_metrics_logging.py).
  """
  if 'tensorboardX' in sys.modules or 'torch' in sys.modules:
    return importlib.import_module('tensorboardX')
  sys.modules['torch'] = None          # `import torch` raises ImportError while this holds
  try:
    # deferred: loaded with the first metrics written, so a bad flag is answered at once
    return importlib.import_module('tensorboardX')
  finally:
    del sys.modules['torch']

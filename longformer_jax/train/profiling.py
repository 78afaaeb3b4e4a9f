"""Profiles of chosen steps: a `jax.profiler` trace written under the workdir.

`train.profile_steps = 'A,B'` traces training steps A to B (1-based, both included) into
`WORKDIR/profile/train/`; `eval.profile_batches = 'A,B'` traces batches A to B of eval.py's
first evaluation into `WORKDIR/profile/eval/`. Each trace is a folder
`plugins/profile/<time>/` holding `<host>.xplane.pb` (TensorBoard's profile plugin, XProf)
and `<host>.trace.json.gz` (Perfetto, ui.perfetto.dev, with nothing to install);
docs/training.md says how to open them. Every traced step carries a step annotation
(`jax.profiler.StepTraceAnnotation`), so the viewers split the trace by step.

The trace starts before step A is dispatched and stops once step B's outputs are ready, so
it holds exactly steps A-B (and the host work between them). A run that ends inside the
window, or a resumed run that starts inside it, traces the steps it ran. On a `gs://`
workdir the trace is written to a local folder and uploaded when it stops, within the
run's storage bound. Only process 0 traces.
"""

import contextlib
import os
import tempfile
import time

import jax

from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.storage import paths
from longformer_jax.train.train_config import parse_step_range


class StepProfiler:
  """Traces the steps of a loop whose numbers fall in `window` into `directory`.

  Usage, for each step `number` (1-based):

      profiler.before(number)
      with profiler.annotation(number):
        outputs = step(...)
      profiler.after(number, outputs)
      ...
      profiler.close()           # in a `finally`: stops a trace the loop left running
  """

  def __init__(self, directory: str, window: 'tuple[int, int] | None', *, name: str,
               bound=None, enabled: bool = True):
    """`directory`: where the trace goes (local or gs://); `name`: the steps' annotation
    ('train', 'eval'); `bound`: a `StorageBound` for the upload to a gs:// directory."""
    self.directory = directory
    self.window = window if enabled else None
    self.name = name
    self._bound = bound
    self._local = None         # the folder being traced into, while a trace runs
    self._staging = None
    self.done = False

  @classmethod
  def disabled(cls) -> 'StepProfiler':
    """A profiler that traces nothing (every call a no-op)."""
    return cls('', None, name='')

  @property
  def active(self) -> bool:
    return self._local is not None

  def before(self, number: int) -> None:
    """Starts the trace if step `number` is the first of the window this run reaches."""
    if self.window is None or self.active or self.done:
      return
    first, last = self.window
    if first <= number <= last:
      if paths.is_remote(self.directory):
        self._staging = tempfile.TemporaryDirectory(prefix='profile_')
        self._local = self._staging.name
      else:
        os.makedirs(self.directory, exist_ok=True)
        self._local = self.directory
      jax.profiler.start_trace(self._local, create_perfetto_trace=True)

  def annotation(self, number: int):
    """A step annotation while tracing (a no-op context otherwise)."""
    if not self.active:
      return contextlib.nullcontext()
    return jax.profiler.StepTraceAnnotation(self.name, step_num=number)

  def after(self, number: int, outputs) -> float:
    """Stops the trace once step `number`, the window's last, has finished (its `outputs`
    ready); returns the seconds spent writing the trace (0.0 when it did not stop)."""
    if self.active and number >= self.window[1]:
      jax.block_until_ready(outputs)
      start = time.perf_counter()
      self._stop()
      return time.perf_counter() - start
    return 0.0

  def close(self) -> None:
    """Stops a trace still running (the loop ended inside the window)."""
    if self.active:
      self._stop()

  def _stop(self) -> None:
    try:
      jax.profiler.stop_trace()
      if self._staging is not None:
        upload = lambda: _copy_tree(self._local, self.directory)
        if self._bound is None:
          upload()
        else:
          self._bound.call('uploading the profile to', self.directory, upload, retry=True)
    finally:
      self._local = None
      self.done = True
      if self._staging is not None:
        self._staging.cleanup()
        self._staging = None


def run_profiler(config, workdir: str, kind: str) -> StepProfiler:
  """The profiler of a run's training (`kind` 'train': `train.profile_steps`) or of eval.py's
  evaluation ('eval': `eval.profile_batches`), tracing into `WORKDIR/profile/KIND`."""
  window = config.train.profile_steps if kind == 'train' else config.eval.profile_batches
  return StepProfiler(os.path.join(workdir, 'profile', kind), parse_step_range(window),
                      name=kind, bound=StorageBound.of(config),
                      enabled=jax.process_index() == 0)


def _copy_tree(local: str, target: str) -> None:
  """Copies every file under the local folder `local` to the same place under `target`."""
  destination = paths.as_path(target)
  for folder, _, names in os.walk(local):
    relative = os.path.relpath(folder, local)
    to = destination if relative == '.' else destination / relative
    to.mkdir(parents=True, exist_ok=True)
    for name in names:
      with open(os.path.join(folder, name), 'rb') as f:
        (to / name).write_bytes(f.read())


def trace_files(directory: str) -> list[str]:
  """The trace files (`*.xplane.pb`, `*.trace.json.gz`) under a local `directory`, sorted."""
  found = []
  for folder, _, names in os.walk(directory):
    found += [os.path.join(folder, name) for name in names
              if name.endswith(('.xplane.pb', '.trace.json.gz'))]
  return sorted(found)

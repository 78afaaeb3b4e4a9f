"""Training throughput (tokens/s or examples/s) over the window since the last log line.

The window holds training only: the loop restarts it after every pause that
is not training (the first compile, a phase change, a validation pass, a
checkpoint save) and after every log line, each time at a point where the
device has finished the steps dispatched so far. Steps counted in a window
are exactly the steps run in its time span, so the rate is right at any
`train.log_every`, including the first window after a resume or an
evaluation.
"""

import time
from typing import Callable


class Throughput:
  """Units (tokens or examples) per second of the current window."""

  def __init__(self, clock: Callable[[], float] = time.perf_counter):
    self._clock = clock
    self._units = 0
    self._start = clock()

  def restart(self) -> None:
    """Starts an empty window now (the device must be idle: nothing in flight is counted)."""
    self._units = 0
    self._start = self._clock()

  def add(self, units: int) -> None:
    """Counts one dispatched step of `units` tokens or examples."""
    self._units += units

  def rate(self) -> float:
    """Units per second since the window started (call once the counted steps have finished)."""
    return self._units / max(self._clock() - self._start, 1e-9)

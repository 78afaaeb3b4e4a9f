"""SIGTERM (TPU preemption, `kill`) turns into a flag the train loop checks.

The loop saves a checkpoint and returns at the end of the current step, so a
preempted run resumes where it stopped with nothing lost.
"""

import signal
import threading


class PreemptionWatcher:
  """Installs a SIGTERM handler for its lifetime (a context manager)."""

  def __init__(self):
    self._event = threading.Event()
    self._previous = None

  def _handle(self, signum, frame):
    del signum, frame
    self._event.set()

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False

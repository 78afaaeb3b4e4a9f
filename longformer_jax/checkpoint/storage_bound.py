"""Storage operations of a run that end within `checkpoint.storage_timeout_s`, however the
storage fails.

A bucket that stops answering is not an error its clients give up on soon: gcsfs retries
a request about six times with growing waits, TensorStore (Orbax's array writer) 32 times,
and a server that accepts connections but never answers (a stopped process, a dead link)
can hold a request for as long as the socket lives. `StorageBound.call` runs one operation
in a daemon thread and waits for it at most `storage_timeout_s` seconds (`start` returns
the running operation as a `Pending`, to wait for or `check` later: the background writes
of a checkpoint save, checkpoint/run_checkpoints.py):

  * it returns the operation's result, or raises its error: a storage failure as one
    `StorageError` line (`storage/storage_errors.py`: operation, path, cause), any other
    error (a corrupt checkpoint, a bug) unchanged;
  * with `retry=True` (operations that may run twice: reads, whole-file writes) a
    transient failure (`storage_errors.is_transient`) is tried again after 0.5, 1, 2, 4
    and then every 8 s while the bound leaves time for another try;
  * past the bound it raises `StorageTimeoutError` (`<operation> <path> did not finish
    within checkpoint.storage_timeout_s = 120 s`, with the last transient error) and
    abandons the thread, still running. Orbax's own save threads are not daemons, so a
    process that abandoned an operation must not wait for its threads at exit: the
    command line ends it with `os._exit` once the line is printed (`command_line.py`).

Nothing half-written is ever taken for a complete step by abandoning a save: Orbax marks
a step complete only as the last act of its save (a rename locally, `commit_success.txt`
on `gs://`), which an abandoned save never reaches (docs/training.md, "When the storage
fails").
"""

import threading
import time
from typing import Any, Callable

from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.storage.storage_errors import (StorageTimeoutError, cause, is_transient,
                                                   reporting)

SETTING = 'checkpoint.storage_timeout_s'
_FIRST_RETRY_S = 0.5                  # wait before the first retry, doubled up to ...
_LONGEST_RETRY_S = 8.0                # ... this


class _Outcome:
  """What the operation's thread left: its result or error, and the last transient error
  it retried (for the timeout's message)."""

  def __init__(self):
    self.done = threading.Event()
    self.result: Any = None
    self.error: 'BaseException | None' = None
    self.last_transient: 'BaseException | None' = None


class Pending:
  """An operation running in its thread against its deadline (`StorageBound.start`)."""

  def __init__(self, bound: 'StorageBound', operation: str, path, deadline: float,
               outcome: _Outcome):
    self._bound = bound
    self._operation = operation
    self._path = path
    self._deadline = deadline
    self._outcome = outcome

  def wait(self) -> Any:
    """The operation's result, once it ends within its deadline.

    Raises:
      StorageError: it failed with a storage failure (retries spent).
      StorageTimeoutError: its deadline passed; it is abandoned, still running.
      Any other error of the operation, unchanged.
    """
    with reporting(self._operation, self._path):
      if not self._outcome.done.wait(max(self._deadline - time.monotonic(), 0.0)):
        raise self._bound.timeout_error(self._operation, self._path,
                                        self._outcome.last_transient)
      if self._outcome.error is not None:
        raise self._outcome.error
      return self._outcome.result

  def check(self) -> bool:
    """Whether it ended well (False: still running within its deadline); raises as `wait`
    once it failed or its deadline passed. Never blocks."""
    if self._outcome.done.is_set() or time.monotonic() >= self._deadline:
      self.wait()
      return True
    return False


class StorageBound:
  """Runs a run's storage operations, each within `seconds` (`checkpoint.storage_timeout_s`)."""

  def __init__(self, seconds: float):
    self.seconds = float(seconds)

  @classmethod
  def of(cls, config) -> 'StorageBound':
    """The bound `config.checkpoint.storage_timeout_s` sets (the section's default where an
    old run's config has no `checkpoint` section)."""
    section = config.get('checkpoint')
    values = section.to_dict() if hasattr(section, 'to_dict') else section
    return cls(CheckpointConfig.build(values, 'checkpoint').storage_timeout_s)

  def call(self, operation: str, path, function: Callable[[], Any], *,
           retry: bool = False) -> Any:
    """`function()`'s result, within the bound (`Pending.wait` says what it raises).

    Args:
      operation: what is done, for the messages ('saving checkpoint 40 in').
      path: where (a workdir, a file, the checkpoints' folder), for the messages.
      function: the operation, without arguments.
      retry: try a transient failure again while the bound leaves time (only for
        operations that may run twice).
    """
    return self.start(operation, path, function, retry=retry).wait()

  def start(self, operation: str, path, function: Callable[[], Any], *, retry: bool = False,
            started: 'float | None' = None) -> Pending:
    """Starts `function` in a daemon thread; its bound ends `seconds` after `started`
    (`time.monotonic()`; default now: a save's background writes share the bound of the
    save that started them)."""
    deadline = (time.monotonic() if started is None else started) + self.seconds
    outcome = _Outcome()
    threading.Thread(target=_attempts, args=(function, retry, deadline, outcome),
                     name=f'storage: {operation}', daemon=True).start()
    return Pending(self, operation, path, deadline, outcome)

  def timeout_error(self, operation: str, path,
                    last_error: 'BaseException | None' = None) -> StorageTimeoutError:
    """The error of an operation still running when its bound passed."""
    retried = f'; the last error, retried: {cause(last_error)}' if last_error else ''
    return StorageTimeoutError(f'{operation} {path} did not finish within {SETTING} = '
                               f'{self.seconds:g} s{retried}')


def _attempts(function: Callable[[], Any], retry: bool, deadline: float,
              outcome: _Outcome) -> None:
  """Runs `function` (again after transient failures while `retry` and the deadline allow);
  leaves its result or last error in `outcome`."""
  wait = _FIRST_RETRY_S
  try:
    while True:
      try:
        outcome.result = function()
        return
      except Exception as error:  # pylint: disable=broad-except
        if not (retry and is_transient(error) and time.monotonic() + wait < deadline):
          raise
        outcome.last_transient = error
      time.sleep(wait)
      wait = min(2 * wait, _LONGEST_RETRY_S)
  except BaseException as error:  # pylint: disable=broad-except
    outcome.error = error
  finally:
    outcome.done.set()

"""A training run's checkpoints, each storage operation within `checkpoint.storage_timeout_s`.

`RunCheckpoints` wraps the run's `Checkpointer` (checkpoint/checkpointer.py) for the
training loop; every call that touches the storage goes through the run's
`StorageBound` (checkpoint/storage_bound.py):

  * opening, listing and restoring may run twice, so transient failures are retried
    within the bound;
  * a save is not retried. Its bound runs from the moment it starts to the end of its
    background writes (an asynchronous save returns once the arrays are copied off the
    devices; a thread then waits for Orbax to write and commit them). `check()`, which
    the loop calls at every step, raises as soon as those writes failed or outlived the
    bound, so a run notices an outage during a save within the bound (plus one training
    step) however far off its next checkpoint is;
  * the next save, `wait` and `close` first wait for the save in flight, within what is
    left of its bound.

It opens the checkpoints with `remove_unfinished`: the run holds the workdir's lease, so
a step without its commit marker is a dead save's (a killed run, a full disk, an
abandoned save), never another writer's, and its space is freed.
"""

import time
from typing import Any, Callable

from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.checkpoint.storage_bound import Pending, StorageBound

PyTree = Any


class RunCheckpoints:
  """The checkpoints of the run in `workdir`, every storage operation within `bound`."""

  def __init__(self, workdir: str, keep: int, async_save: bool, bound: StorageBound):
    """Opens (creating) `workdir/checkpoints`. `keep`, `async_save`: as for `Checkpointer`
    (`train.keep_checkpoints`, `train.async_checkpointing`)."""
    self._bound = bound
    self._checkpointer: Checkpointer = bound.call(
        'opening the checkpoints in', workdir,
        lambda: Checkpointer(workdir, keep, async_save=async_save, remove_unfinished=True),
        retry=True)
    self._in_flight: 'Pending | None' = None

  @property
  def directory(self) -> str:
    return self._checkpointer.directory

  def latest_step(self) -> 'int | None':
    """The newest complete step, or None."""
    return self._bound.call('listing the checkpoints in', self.directory,
                            self._checkpointer.latest_step, retry=True)

  def restore_latest_intact(self, abstract_state: PyTree,
                            from_params: 'Callable | None' = None) -> tuple[PyTree, dict, int]:
    """`Checkpointer.restore_latest_intact` within the bound (a storage failure while
    reading is retried, never taken for a corrupt step)."""
    return self._bound.call(
        'restoring the newest checkpoint in', self.directory,
        lambda: self._checkpointer.restore_latest_intact(abstract_state, from_params),
        retry=True)

  def save(self, step: int, state: PyTree, data_state: dict) -> bool:
    """Starts saving `(state, data_state)` as checkpoint `step` (`Checkpointer.save`) once
    the save in flight ended; False when `step` is already saved."""
    self.wait()
    started = time.monotonic()
    operation = f'saving checkpoint {int(step)} in'
    saved = self._bound.start(operation, self.directory,
                              lambda: self._checkpointer.save(step, state, data_state),
                              started=started).wait()
    if saved and self._checkpointer.async_save:
      self._in_flight = self._bound.start(operation, self.directory, self._checkpointer.wait,
                                          started=started)
    return saved

  def check(self) -> None:
    """Raises at once when the save in flight failed or outlived its bound; never blocks."""
    if self._in_flight is not None and self._in_flight.check():
      self._in_flight = None

  def wait(self) -> None:
    """Waits for the save in flight (within what is left of its bound)."""
    pending, self._in_flight = self._in_flight, None
    if pending is not None:
      pending.wait()

  def close(self) -> None:
    """Waits for the save in flight and releases Orbax's resources."""
    self.wait()
    self._bound.call('closing the checkpoints in', self.directory, self._checkpointer.close)

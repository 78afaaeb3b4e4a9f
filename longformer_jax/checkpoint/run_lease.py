"""The lease of a whole run: process 0 holds `checkpoint/workdir_lease.py`'s lease for all
the run's processes, within the run's storage bound.

`held(workdir, settings)` is the context a run trains in: process 0 takes the lease (or is
refused: `WorkdirInUseError`, exit status 73) and tells the others, which then raise the
same refusal; it renews it in the background and releases it at the end, also on an error,
except a storage failure (no waiting on a storage that failed: the next run takes the lease
over). Taking and releasing end within `checkpoint.storage_timeout_s`
(`checkpoint/storage_bound.py`), transient storage failures retried.
"""

import contextlib
import logging

import jax
from jax.experimental import multihost_utils
import numpy as np

from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.checkpoint.workdir_lease import WorkdirInUseError, WorkdirLease
from longformer_jax.storage.storage_errors import is_storage_failure

_log = logging.getLogger(__name__)


class _NoLease:
  """What the processes other than 0 hold: process 0 checks for all."""

  def check(self) -> None:
    pass


@contextlib.contextmanager
def held(workdir: str, settings: CheckpointConfig):
  """The run's lease on `workdir` for the body (process 0 holds it for every process),
  renewed in the background and released at the end, also on an error. Yields an object
  with `check()`; raises `WorkdirInUseError` in every process when it is refused."""
  lease, failure = None, None
  bound = StorageBound(settings.storage_timeout_s)
  if jax.process_index() == 0:
    try:
      # A retry finds the lease a lost reply created as this process's own, and takes it.
      lease = bound.call('taking the lease on', workdir,
                         lambda: WorkdirLease.acquire(workdir, settings), retry=True)
    except Exception as error:  # pylint: disable=broad-except
      failure = error             # raised below, after the others heard of it
  if jax.process_count() > 1:
    refused = int(multihost_utils.broadcast_one_to_all(np.int32(failure is not None)))
    if refused and failure is None:
      failure = WorkdirInUseError(f'--workdir: {workdir}: process 0 of this run could not '
                                  f'take the workdir\'s lease (its error says why)')
  if failure is not None:
    raise failure
  if lease is None:
    yield _NoLease()
    return
  lease.start_renewing()
  stopping = None
  try:
    yield lease
  except BaseException as error:
    stopping = error
    raise
  finally:
    if stopping is not None and is_storage_failure(stopping):
      lease.stop_renewing()       # no waiting on a failed storage: the next run takes it over
    else:
      release_logging_failures(lease, bound)


def release_logging_failures(lease: WorkdirLease, bound: StorageBound) -> None:
  """Releases `lease` within `bound`; a failure is one warning line (the lease goes stale in
  time)."""
  try:
    bound.call('releasing the lease', lease.path, lease.release)
  except Exception as error:  # pylint: disable=broad-except
    _log.warning('Could not release the lease %s (%s: %s); the next run takes it over.',
                 lease.path, type(error).__name__, error)

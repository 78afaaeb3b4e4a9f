"""One writer per workdir: the lease a training run holds on `DIR/lease.json`.

Two runs writing one workdir interleave checkpoints and metrics (two schedulers, a job
restarted while it still runs). A run therefore takes a lease before it reads or writes
anything there, and holds it until it ends:

  * The lease is a small JSON file, `DIR/lease.json`: the holder's host, process id (and
    that process's start time, so a reused id is not taken for the holder), when it
    started, when it last renewed, and a random token. It is created only if absent
    (`storage/conditional_writes.py`: a hard link locally, GCS's `ifGenerationMatch=0`
    on `gs://`), so of two runs starting at once exactly one wins.
  * A second run finds it and, while it is live, is refused: `WorkdirInUseError`, one
    line naming the holder, exit status 73 (`WORKDIR_IN_USE_STATUS`).
  * A lease is a dead run's when its process is gone (judged on the lease's own host
    only) or when it has not been renewed for `checkpoint.lease_stale_s` seconds (any
    host). The next run replaces it, only if it is still the version it judged (so of
    two runs taking over at once one wins), and says so in one warning line.
  * Process 0 of the run holds it for all the run's processes (`checkpoint/run_lease.py`):
    the others learn from it whether the run may go on.
  * While the run trains, a background thread renews it every `checkpoint.lease_renew_s`
    seconds. A thread, not the loop: the first compile, a long validation or a checkpoint
    save can each outlast any sensible stale time, and the lease says that the process
    lives, not that it steps. A renewal that finds the lease replaced (another run judged
    this one dead) makes the loop's next `check()` raise `LeaseLostError`: the run stops
    without saving, so the two never interleave. A renewal that fails for another reason
    (storage unreachable) is logged once and tried again at the next period.
  * The lease is released (deleted, if still this run's) when the run ends, also on an
    error, except a storage failure (no waiting on a storage that failed); a killed run
    leaves it behind too, for the next run to take over.
  * Taking and releasing it end within `checkpoint.storage_timeout_s` (run_lease.py).
"""

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Callable

from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.config.errors import UserError
from longformer_jax.storage import conditional_writes, paths

LEASE_FILE = 'lease.json'
WORKDIR_IN_USE_STATUS = 73      # sysexits' EX_CANTCREAT: the workdir cannot be written now

_RELEASE_WAIT_S = 5.0           # how long release waits for a renewal in flight

_log = logging.getLogger(__name__)


class WorkdirInUseError(UserError):
  """Another live run holds the workdir's lease; nothing was read or written."""
  exit_status = WORKDIR_IN_USE_STATUS


class LeaseLostError(UserError):
  """Another run took this run's lease over (it judged this run dead); this run stops."""
  exit_status = WORKDIR_IN_USE_STATUS


def process_start_ticks(pid: int) -> 'int | None':
  """When process `pid` started, in clock ticks since boot (Linux `/proc`); None elsewhere
  or when there is no such process."""
  try:
    with open(f'/proc/{pid}/stat', encoding='ascii', errors='replace') as file:
      fields = file.read().rsplit(')', 1)[1].split()
    return int(fields[19])            # field 22 of stat(5); fields[0] is field 3
  except (OSError, IndexError, ValueError):
    return None


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lease. Times are seconds since the epoch (`time.time()`)."""
  host: str
  pid: int
  pid_start: 'int | None'
  started: float
  renewed: float
  token: str

  @classmethod
  def this_process(cls, now: float) -> 'Holder':
    pid = os.getpid()
    return cls(socket.gethostname(), pid, process_start_ticks(pid), now, now,
               secrets.token_hex(8))

  def encode(self) -> bytes:
    return json.dumps(dataclasses.asdict(self), indent=1).encode()

  @classmethod
  def decode(cls, data: bytes) -> 'Holder | None':
    """The holder a lease file names; None when it is not a lease this code wrote."""
    try:
      values = json.loads(data)
      return cls(str(values['host']), int(values['pid']), values.get('pid_start'),
                 float(values['started']), float(values['renewed']), str(values['token']))
    except (ValueError, KeyError, TypeError):
      return None

  def describe(self, now: float) -> str:
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.started))
    return (f'host {self.host}, pid {self.pid}, started {started}, '
            f'renewed {max(now - self.renewed, 0):.0f} s ago')


def dead_reason(holder: 'Holder | None', now: float, stale_s: float) -> 'str | None':
  """Why the run that holds a lease is dead, or None while it may be alive."""
  if holder is None:
    return 'it is not a lease file this code wrote'
  if holder.host == socket.gethostname():
    if holder.pid == os.getpid():
      return f'its process id {holder.pid} is this process'   # a restarted container
    start = process_start_ticks(holder.pid)
    if not _pid_exists(holder.pid) or (start is not None and holder.pid_start is not None
                                       and start != holder.pid_start):
      return f'its process {holder.pid} on this host is gone'
  age = now - holder.renewed
  if age > stale_s:
    return f'not renewed for {age:.0f} s > checkpoint.lease_stale_s = {stale_s:g}'
  return None


def _pid_exists(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:           # another user's process: it exists
    return True
  return True


def in_use_error(workdir: str, holder: Holder, settings: CheckpointConfig,
                 now: float) -> WorkdirInUseError:
  """The refusal of a second writer on `workdir`, which the live `holder` holds."""
  return WorkdirInUseError(
      f'--workdir: {workdir} is in use by another run ({holder.describe(now)}); '
      f'a second writer is refused. Stop that run, or wait until its lease goes '
      f'{settings.lease_stale_s:g} s without renewal (checkpoint.lease_stale_s)')


def live_holder(workdir: str, settings: CheckpointConfig,
                clock: Callable[[], float] = time.time) -> 'Holder | None':
  """The live run that holds `workdir`'s lease, or None (no lease, or a dead run's); only
  reads. `WorkdirLease.acquire` decides; this lets a start refuse early
  (checkpoint/early_refusal.py)."""
  found = conditional_writes.read(os.fspath(paths.as_path(workdir) / LEASE_FILE))
  if found is None:
    return None
  holder = Holder.decode(found[0])
  return holder if dead_reason(holder, clock(), settings.lease_stale_s) is None else None


class WorkdirLease:
  """This process's lease on a workdir; `acquire` it, `release` it (or use
  `run_lease.held`)."""

  def __init__(self, path: str, holder: Holder, version: str, settings: CheckpointConfig,
               clock: Callable[[], float]):
    self.path = path
    self.holder = holder
    self._version = version
    self._settings = settings
    self._clock = clock
    self._lost: 'LeaseLostError | None' = None
    self._stop = threading.Event()
    self._keeper: 'threading.Thread | None' = None
    self._lock = threading.Lock()

  @classmethod
  def acquire(cls, workdir: str, settings: CheckpointConfig,
              clock: Callable[[], float] = time.time) -> 'WorkdirLease':
    """Takes the lease on `workdir` (creating the workdir), or takes over a dead run's.

    Raises:
      WorkdirInUseError: a live run holds it (or won every race for a dead run's lease).
    """
    path = os.fspath(paths.as_path(workdir) / LEASE_FILE)
    for _ in range(5):
      mine = Holder.this_process(clock())
      try:
        return cls(path, mine, conditional_writes.create(path, mine.encode()), settings, clock)
      except conditional_writes.VersionChangedError:
        pass
      found = conditional_writes.read(path)
      if found is None:               # released since: try creating again
        continue
      data, version = found
      other = Holder.decode(data)
      reason = dead_reason(other, clock(), settings.lease_stale_s)
      if reason is None:
        raise in_use_error(workdir, other, settings, clock())
      try:
        version = conditional_writes.replace(path, mine.encode(), version)
      except conditional_writes.VersionChangedError:
        continue                      # another run replaced it first: judge theirs
      who = other.describe(clock()) if other else 'an unreadable lease'
      _log.warning('Took over the lease on %s from a dead run (%s): %s.', workdir, who, reason)
      return cls(path, mine, version, settings, clock)
    raise WorkdirInUseError(f'--workdir: {workdir}: other runs kept taking its lease '
                            f'({path}) while this one tried; a second writer is refused')

  def renew(self) -> None:
    """Writes a new renewal time, if the lease is still this run's (else records the loss)."""
    with self._lock:
      if self._lost is not None:
        return
      renewed = dataclasses.replace(self.holder, renewed=self._clock())
      try:
        self._version = conditional_writes.replace(self.path, renewed.encode(), self._version)
        self.holder = renewed
      except conditional_writes.VersionChangedError:
        found = conditional_writes.read(self.path)
        other = Holder.decode(found[0]) if found else None
        taker = f'by {other.describe(self._clock())}' if other else '(and deleted)'
        self._lost = LeaseLostError(
            f'--workdir: the lease {self.path} was taken over {taker}, which judged this '
            f'run dead; stopping without saving so that two runs never write one workdir')

  def check(self) -> None:
    """Raises `LeaseLostError` if a renewal found the lease taken over."""
    if self._lost is not None:
      raise self._lost

  def start_renewing(self) -> None:
    """Renews every `checkpoint.lease_renew_s` seconds in a daemon thread until `release`."""
    self._keeper = threading.Thread(target=self._keep, name='workdir-lease', daemon=True)
    self._keeper.start()

  def _keep(self) -> None:
    failures = 0
    while not self._stop.wait(self._settings.lease_renew_s) and self._lost is None:
      try:
        self.renew()
        failures = 0
      except Exception as error:  # pylint: disable=broad-except
        failures += 1
        if failures == 1:           # once per outage: the next success resets it
          _log.warning('Could not renew the lease %s (%s: %s); retrying every %g s.',
                       self.path, type(error).__name__, error, self._settings.lease_renew_s)

  def stop_renewing(self) -> None:
    """Stops the renewals without waiting and leaves the lease file as it is."""
    self._stop.set()

  def release(self) -> None:
    """Stops renewing and deletes the lease if it is still this run's."""
    self._stop.set()
    if self._keeper is not None:
      self._keeper.join(timeout=_RELEASE_WAIT_S)
    if not self._lock.acquire(timeout=_RELEASE_WAIT_S):   # a renewal hangs on the storage
      raise TimeoutError(f'a renewal of {self.path} did not end within {_RELEASE_WAIT_S} s')
    try:
      if self._lost is None:
        with contextlib.suppress(conditional_writes.VersionChangedError):
          conditional_writes.delete(self.path, self._version)
        self._lost = LeaseLostError(f'--workdir: the lease {self.path} was released')
    finally:
      self._lock.release()

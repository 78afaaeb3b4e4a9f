"""A storage failure (a bucket or disk failing mid-run) as one line: operation, path, cause.

The clients raise many kinds of errors for one outage (gcsfs's `HttpError`, aiohttp's
connection errors, `OSError`s, TensorStore's statuses inside Orbax's errors), each with
its traceback and often chained several deep. `reporting(operation, path)` turns any of
them into one `StorageError` whose message says what was being done, where, and the
innermost cause:

  saving checkpoint 40 in gs://bucket/run/checkpoints failed: ClientConnectorError: Cannot
  connect to host 127.0.0.1:4443

The command line prints it as its one line and exits with status 75 (`STORAGE_FAILURE_STATUS`,
sysexits' EX_TEMPFAIL), so a scheduler retries the run later: it resumes from its newest
complete checkpoint, which a failure never replaces. It exits with
`exit_abandoning_threads`: threads still waiting on the failed storage (Orbax's save
threads, which are no daemons, and the operations `checkpoint/storage_bound.py` abandoned)
would otherwise hold the exit for as long as their clients retry.

`is_transient` tells the failures worth trying again (a connection refused or cut, a
timeout, a server's 5xx or 429, TensorStore's UNAVAILABLE) from the ones that will fail
the same way (a full disk, a refused permission, a missing object); `checkpoint/storage_bound.py`
retries the first kind within the run's bound and raises `StorageTimeoutError` past it.
"""

import asyncio
import contextlib
import errno
import logging
import os
import re
import sys

from longformer_jax.config.errors import UserError
# paths sets gcsfs's environment (no experimental bucket-type lookups) before gcsfs loads.
from longformer_jax.storage import paths  # pylint: disable=unused-import

STORAGE_FAILURE_STATUS = 75         # sysexits' EX_TEMPFAIL: try again later
_MAX_CAUSE_CHARACTERS = 300
# Words of the statuses TensorStore (Orbax's array writer) reports a failed transfer with.
_TRANSFER_STATUSES = ('UNAVAILABLE', 'DEADLINE_EXCEEDED', 'Error writing', 'Error reading',
                      'CURL error', 'Couldn\'t connect', 'Connection refused')


# Words of the failures that may pass: TensorStore's statuses and curl's, the clients' texts.
_TRANSIENT_WORDS = ('UNAVAILABLE', 'DEADLINE_EXCEEDED', 'CURL error', 'Couldn\'t connect',
                    'Connection refused', 'Connection reset', 'timed out', 'Timeout')
# The operating system's "the disk refused the write", as TensorStore words it.
_TENSORSTORE_OS_ERROR = re.compile(r"os_error_code='?(\d+)")
_DISK_FULL = {errno.ENOSPC: 'no space left on device', errno.EDQUOT: 'disk quota exceeded',
              errno.EFBIG: 'file too large (a file-size limit, e.g. ulimit -f)'}


class StorageError(UserError):
  """The storage failed during `operation` on `path`; nothing half-written was committed."""
  exit_status = STORAGE_FAILURE_STATUS


class StorageTimeoutError(StorageError):
  """A storage operation did not end within the run's bound (`checkpoint.storage_timeout_s`);
  it was abandoned, still running, and the process must end without waiting for it."""


def _client_error_types() -> 'tuple[type, type]':
  """aiohttp's and gcsfs's error classes, or classes nothing raises while they are unloaded.

  Neither is imported here: only a gs:// path loads them (through fsspec), and an error
  of theirs cannot exist before they are loaded. A local run never pays for the import.
  """
  aiohttp = sys.modules.get('aiohttp')
  gcsfs_retry = sys.modules.get('gcsfs.retry')
  return (aiohttp.ClientError if aiohttp is not None else _NeverRaised,
          gcsfs_retry.HttpError if gcsfs_retry is not None else _NeverRaised)


class _NeverRaised(Exception):
  """Stands for an error class whose library is not loaded."""


def is_transient(error: BaseException) -> bool:
  """Whether `error` (or an error it was raised from) is a failure that may pass if tried
  again: no connection, a cut or timed-out one, a server's 5xx or 429."""
  client_error, http_error = _client_error_types()
  for link in chain(error):
    if isinstance(link, (client_error, ConnectionError, TimeoutError, asyncio.TimeoutError)):
      return True
    if isinstance(link, http_error):
      gcsfs_retry = sys.modules['gcsfs.retry']
      return gcsfs_retry.is_retriable(link)     # GCS's own list: 408, 429, 5xx, ...
    if any(word in str(link) for word in _TRANSIENT_WORDS):
      return True
  return False


def is_storage_failure(error: BaseException) -> bool:
  """Whether `error`, or an error it was raised from, is the storage's (not a bug's)."""
  client_error, http_error = _client_error_types()
  for link in chain(error):
    if isinstance(link, (OSError, client_error, http_error, StorageError)):
      return True
    if any(word in str(link) for word in _TRANSFER_STATUSES):
      return True
  return False


def chain(error: BaseException) -> list:
  """`error` and the errors it was raised from or during, outermost first."""
  links, seen = [], set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    links.append(error)
    error = error.__cause__ or error.__context__
  return links


def cause(error: BaseException) -> str:
  """The innermost storage error of `error`'s chain, as `Type: last line of its message`."""
  failures = [link for link in chain(error) if is_storage_failure(link) and
              not isinstance(link, StorageError)] or [error]
  innermost = failures[-1]
  code = innermost.errno if isinstance(innermost, OSError) else None
  if code is None:
    found = _TENSORSTORE_OS_ERROR.search(str(innermost))
    code = int(found.group(1)) if found else None
  if code in _DISK_FULL:
    return f'{_DISK_FULL[code]} (os error {code})'
  lines = [line.strip() for line in str(innermost).strip().splitlines() if line.strip()]
  text = f'{type(innermost).__name__}: {lines[-1]}' if lines else type(innermost).__name__
  if len(text) > _MAX_CAUSE_CHARACTERS:
    text = text[:_MAX_CAUSE_CHARACTERS - 3] + '...'
  return text


@contextlib.contextmanager
def reporting(operation: str, path=None):
  """Turns a storage failure inside the body into `StorageError('<operation> <path> failed:
  <cause>')`; any other error passes unchanged."""
  where = f'{operation} {os.fspath(path)}' if path is not None else operation
  try:
    yield
  except Exception as error:  # pylint: disable=broad-except
    # The package's own errors (a corrupt checkpoint, a bad setting) already say what is wrong.
    if type(error).__module__.startswith('longformer_jax') or not is_storage_failure(error):
      raise
    raise StorageError(f'{where} failed: {cause(error)}') from error


def exit_abandoning_threads(status: int) -> None:
  """Ends the process with `status` without waiting for its threads: the log handlers and
  the standard streams are flushed, and nothing else runs (no `atexit`, no thread joins)."""
  for handler in logging.getLogger().handlers + logging.getLogger('absl').handlers:
    handler.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access

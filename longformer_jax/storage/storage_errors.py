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
complete checkpoint, which a failure never replaces.
"""

import contextlib
import errno
import os

import aiohttp
from gcsfs import retry as gcsfs_retry

from longformer_jax.config.errors import UserError

STORAGE_FAILURE_STATUS = 75         # sysexits' EX_TEMPFAIL: try again later
_MAX_CAUSE_CHARACTERS = 300
# Words of the statuses TensorStore (Orbax's array writer) reports a failed transfer with.
_TRANSFER_STATUSES = ('UNAVAILABLE', 'DEADLINE_EXCEEDED', 'Error writing', 'Error reading',
                      'CURL error', 'Couldn\'t connect', 'Connection refused')


class StorageError(UserError):
  """The storage failed during `operation` on `path`; nothing half-written was committed."""
  exit_status = STORAGE_FAILURE_STATUS


def is_storage_failure(error: BaseException) -> bool:
  """Whether `error`, or an error it was raised from, is the storage's (not a bug's)."""
  for link in chain(error):
    if isinstance(link, (OSError, aiohttp.ClientError, gcsfs_retry.HttpError)):
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
  if isinstance(innermost, OSError) and innermost.errno == errno.ENOSPC:
    return f'no space left on device ({os.strerror(errno.ENOSPC)})'
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

"""Keeps the command line readable: library INFO chatter (orbax, absl) is dropped.

Our own INFO messages, and every library's warnings and errors, still show, with one
exception: when the storage fails, its clients log the failure with its traceback before
raising it (Orbax from each of its save threads, about 4 KB each for a full disk; gcsfs
for each request out of retries, 40 lines each), and the error then reaches the run, which
reports it in one line (`storage/storage_errors.py`). Those copies are dropped, unless
`--debug` asks for every traceback.
"""

import logging as std_logging

from absl import logging

from longformer_jax.storage.storage_errors import is_storage_failure

_OWN_CODE = ('longformer_jax', 'train.py', 'eval.py', 'benchmarks')
_CLIENT_CODE = ('/orbax/', '/gcsfs/')


class _OwnInfoOnly(std_logging.Filter):

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or any(
        part in record.pathname for part in _OWN_CODE)


class _NoClientStorageTracebacks(std_logging.Filter):
  """Drops the storage clients' (Orbax's, gcsfs's) log records that carry a storage
  failure's traceback."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (error is not None and any(code in record.pathname for code in _CLIENT_CODE)
                and is_storage_failure(error))


def show_own_info_only(debug: bool = False) -> None:
  """Installs the filters on absl's handler; `debug` keeps the clients' storage tracebacks."""
  logging.set_verbosity(logging.INFO)
  handler = logging.get_absl_handler()
  handler.addFilter(_OwnInfoOnly())
  if not debug:
    handler.addFilter(_NoClientStorageTracebacks())

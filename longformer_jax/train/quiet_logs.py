"""Keeps the command line readable: library INFO chatter (orbax, absl) is dropped.

Our own INFO messages, and every library's warnings and errors, still show, with one
exception: when the storage fails under a checkpoint save, Orbax logs the failure from
each of its threads, each with the same long traceback (a full disk: four of them, about
4 KB each), before the error reaches the run, which reports it in one line
(`storage/storage_errors.py`). Those copies are dropped, unless `--debug` asks for every
traceback.
"""

import logging as std_logging

from absl import logging

from longformer_jax.storage.storage_errors import is_storage_failure

_OWN_CODE = ('longformer_jax', 'train.py', 'eval.py', 'benchmarks')
_ORBAX_CODE = '/orbax/'


class _OwnInfoOnly(std_logging.Filter):

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or any(
        part in record.pathname for part in _OWN_CODE)


class _NoOrbaxStorageTracebacks(std_logging.Filter):
  """Drops Orbax's log records that carry a storage failure's traceback."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (error is not None and _ORBAX_CODE in record.pathname
                and is_storage_failure(error))


def show_own_info_only(debug: bool = False) -> None:
  """Installs the filters on absl's handler; `debug` keeps Orbax's storage tracebacks."""
  logging.set_verbosity(logging.INFO)
  handler = logging.get_absl_handler()
  handler.addFilter(_OwnInfoOnly())
  if not debug:
    handler.addFilter(_NoOrbaxStorageTracebacks())

"""Hides the debris that a failed Orbax read leaves behind.

When Orbax cannot read a checkpoint (a missing or truncated file), the error
itself is one line, but TensorStore and asyncio go on reporting on the reads
that were in flight, one traceback each and often hundreds in all, burying
the line that names the broken step:

  * "Event loop is closed": TensorStore finishes the outstanding reads on its
    own (native) threads and hands each result to the asyncio loop of the
    read with `loop.call_soon_threadsafe`; Orbax has closed that loop by then,
    so each call raises and TensorStore reports it through
    `sys.unraisablehook` (a bare traceback starting in `call_soon_threadsafe`).
  * "Exception ignored in: <coroutine ...>": an Orbax coroutine that failed
    is garbage collected (`sys.unraisablehook`).
  * "Future/Task exception was never retrieved" (the `asyncio` logger).
  * "RuntimeWarning: coroutine '...' was never awaited" for an Orbax
    coroutine that an aborted `asyncio.gather` never started (`warnings`).

These reports can come at any time after the failed read has returned: when
TensorStore's threads get to them (later on a loaded machine) or when the
garbage collector runs. So the filters are installed before the first read
(`install()`, which `Checkpointer` calls when it is created and again at every
restore) and are never removed. They drop exactly these reports and pass on
every other one, so errors of other code still show.
"""

import asyncio
import inspect
import logging
import os
import re
import sys
import traceback
import warnings
from typing import Any

_ORBAX_WORDS = ('orbax', 'tensorstore', 'ocdbt', 'zarr')
_LOOP_CLOSED = 'Event loop is closed'
_ASYNCIO_DIR = os.path.dirname(asyncio.__file__)


def install() -> None:
  """Installs the filters (idempotent; again if something replaced them)."""
  asyncio_log = logging.getLogger('asyncio')
  if not any(isinstance(f, _DropNeverRetrieved) for f in asyncio_log.filters):
    asyncio_log.addFilter(_DropNeverRetrieved())
  _drop_never_awaited_warnings()
  hook = sys.unraisablehook
  if getattr(hook, 'drops_orbax_read_noise', False):
    return

  def filtered(unraisable: Any) -> None:
    if not is_orbax_read_noise(unraisable):
      hook(unraisable)

  filtered.drops_orbax_read_noise = True
  sys.unraisablehook = filtered


def is_orbax_read_noise(unraisable: Any) -> bool:
  """Whether an unraisable exception is debris of a failed Orbax read."""
  error = unraisable.exc_value
  if isinstance(error, RuntimeError) and str(error) == _LOOP_CLOSED:
    # Called from native code (TensorStore), the traceback starts in asyncio.
    frames = traceback.extract_tb(unraisable.exc_traceback)
    if not frames or os.path.dirname(frames[0].filename) == _ASYNCIO_DIR:
      return True
  code = getattr(unraisable.object, 'cr_code', None)  # A dropped coroutine.
  return code is not None and _ORBAX_WORDS[0] in code.co_filename


class _DropNeverRetrieved(logging.Filter):
  """Drops asyncio's 'exception was never retrieved' for Orbax's reads."""

  def filter(self, record: logging.LogRecord) -> bool:
    if 'exception was never retrieved' not in str(record.msg):
      return True
    error = record.exc_info[1] if record.exc_info else None
    return not (_mentions_orbax(error) or any(
        word in str(record.msg).lower() for word in _ORBAX_WORDS))


def _mentions_orbax(error: BaseException | None) -> bool:
  """Whether `error` comes from Orbax/TensorStore code or names their parts."""
  if error is None:
    return False
  frames = traceback.extract_tb(error.__traceback__)
  text = ' '.join([str(error)] + [frame.filename for frame in frames]).lower()
  return any(word in text for word in _ORBAX_WORDS)


_never_awaited_pattern = {'modules': 0, 'regex': ''}


def _drop_never_awaited_warnings() -> None:
  """Ignores "coroutine 'X' was never awaited" for Orbax's coroutines X.

  The warning names a coroutine only by its qualified name, so the names of
  the coroutine functions of the loaded Orbax modules are collected (again
  when more of them are loaded; a few ms). `filterwarnings` replaces an
  equal filter, so calling this again (pytest resets the filters per test)
  adds nothing.
  """
  modules = [(name, module) for name, module in list(sys.modules.items())
             if name.startswith('orbax.') and module is not None]
  if len(modules) != _never_awaited_pattern['modules']:
    names = sorted(set().union(*(_coroutine_names(m) for _, m in modules)))
    _never_awaited_pattern.update(
        modules=len(modules),
        regex="coroutine '(?:%s)' was never awaited" % '|'.join(
            re.escape(name) for name in names))
  if _never_awaited_pattern['regex']:
    warnings.filterwarnings('ignore', _never_awaited_pattern['regex'],
                            RuntimeWarning)


def _coroutine_names(module: Any) -> set[str]:
  """Qualified names of the coroutine functions defined in `module`."""
  names = set()
  for value in list(vars(module).values()):
    if inspect.isclass(value) and value.__module__ == module.__name__:
      members = [getattr(v, '__func__', v) for v in vars(value).values()]
    else:
      members = [value]
    # Some Orbax versions hold lazily loaded modules that pass
    # iscoroutinefunction but have no qualified name: skip them.
    names.update(getattr(member, '__qualname__', None) for member in members
                 if inspect.iscoroutinefunction(member))
  names.discard(None)
  return names

"""Keeps the command line readable: library INFO chatter (orbax, absl) is dropped.

Our own INFO messages, and every library's warnings and errors, still show.
"""

import logging as std_logging

from absl import logging

_OWN_CODE = ('longformer_jax', 'train.py', 'eval.py', 'benchmarks')


class _OwnInfoOnly(std_logging.Filter):

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or any(
        part in record.pathname for part in _OWN_CODE)


def show_own_info_only() -> None:
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_OwnInfoOnly())

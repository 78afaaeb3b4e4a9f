"""How Orbax writes a replicated array: whole, from one device, within one process.

Orbax's default `ArrayHandler` saves "replica-parallel" on every platform but GPU: an
array replicated over n devices is cut into n slices along its first axis and each
replica writes one. Across hosts that spreads the bytes of a save over the hosts'
links. Within one process it only adds work: every slice is a separate program
(`lax.slice` of its own shape, compiled on first use) and a separate transfer. A
train state of 55 arrays replicated over 8 devices cost 384 slices and 64 compiles,
about a second, at every first save of a process; written whole it costs none
(tests/checkpoint/test_array_writes.py counts them).

`use_whole_array_writes()` registers, once, Orbax's `ArrayHandler` with replica-parallel
off when the run has one process, and leaves Orbax's default in a multi-host run. The
bytes on disk are the same either way (the test restores one from the other).
"""

import logging

import jax
import orbax.checkpoint as ocp
# Orbax's default handler for `jax.Array` keeps array metadata in this store; the handler
# registered here keeps it too (the module is not exported by orbax.checkpoint).
from orbax.checkpoint._src.metadata import array_metadata_store

_registered = False


def use_whole_array_writes() -> None:
  """In a one-process run, Orbax writes each replicated array whole (see above)."""
  global _registered
  if _registered or jax.process_count() > 1:
    return
  handler = ocp.type_handlers.ArrayHandler(use_replica_parallel=False,
                                           array_metadata_store=array_metadata_store.Store())
  # Orbax warns of every override, on stderr through absl's logger: a command line's
  # errors are one line, and this override is meant.
  absl_log = logging.getLogger('absl')
  quiet = lambda record: 'overriding' not in record.getMessage()
  absl_log.addFilter(quiet)
  try:
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
  finally:
    absl_log.removeFilter(quiet)
  _registered = True

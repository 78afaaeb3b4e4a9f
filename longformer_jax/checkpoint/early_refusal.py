"""A second `train.py` on a workdir a live run holds is refused before JAX is imported.

Importing JAX, Orbax and the models takes seconds (2.5 s on an idle 2-core host, twice
that on a busy one), and the lease (checkpoint/workdir_lease.py) is taken only once the
config is resolved and the processes have joined. `refuse_a_held_workdir(argv)` runs first
in `train.py`, importing only the config files, the lease and the storage clients: it
reads `--workdir`, `--config` and the `--config.checkpoint.*` overrides from the raw
arguments, builds `config.checkpoint` from them (its defaults are the section's own) and,
when a live run holds the workdir's lease, prints the refusal's line and exits with status
73, the same line and status as the full start.

It only reads, and decides nothing else: whatever it cannot tell (a bad flag or config, a
missing bucket, a lease that is free or a dead run's) it leaves to the full start, which
takes the lease or refuses it for good. A multi-process run (`parallel.multi_host`) is
left to the full start too, where process 0 decides for every process. Its read is the
run's first storage operation and ends within `checkpoint.storage_timeout_s`
(checkpoint/storage_bound.py); a storage that does not answer by then ends the run with
status 75, as the full start's first operation would after another bound.
"""

import sys
import time

from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.checkpoint.workdir_lease import LEASE_FILE, in_use_error, live_holder
from longformer_jax.config.errors import UserError
from longformer_jax.config.command_line_args import (DEFAULT_CONFIG, DEFAULT_WORKDIR,
                                                      flag_value, split_config_overrides)
from longformer_jax.config.overrides import load_config_file, with_overrides
from longformer_jax.parallel.parallel_config import ParallelConfig
from longformer_jax.storage.storage_errors import (StorageError, StorageTimeoutError,
                                                   exit_abandoning_threads, is_transient)


def held_workdir_refusal(argv: list) -> 'UserError | None':
  """The error that ends the run `argv` starts, before JAX loads: `WorkdirInUseError` when
  a live run holds its workdir, `StorageError` when the storage did not answer within the
  bound; else None (also when anything is unclear: the full start decides)."""
  try:
    rest, overrides = split_config_overrides(argv[1:])
    values = with_overrides(load_config_file(flag_value(rest, 'config', DEFAULT_CONFIG)),
                            overrides)
    if ParallelConfig.build(values.get('parallel'), 'parallel').multi_host:
      return None
    settings = CheckpointConfig.build(values.get('checkpoint'), 'checkpoint')
    workdir = flag_value(rest, 'workdir', DEFAULT_WORKDIR)
  except Exception:  # pylint: disable=broad-except  # the full start reports it
    return None
  try:
    holder = StorageBound(settings.storage_timeout_s).call(
        'reading the lease', f'{workdir}/{LEASE_FILE}', lambda: live_holder(workdir, settings),
        retry=True)
  except StorageError as error:
    unanswered = isinstance(error, StorageTimeoutError) or is_transient(error)
    return error if unanswered else None        # a missing bucket: the full start says so
  except Exception:  # pylint: disable=broad-except
    return None
  return None if holder is None else in_use_error(workdir, holder, settings, time.time())


def refuse_a_held_workdir(argv: list) -> None:
  """Ends the process with the error's line and status (73, or 75 for a storage that did
  not answer) when `held_workdir_refusal` finds one; returns otherwise."""
  refusal = held_workdir_refusal(argv)
  if refusal is not None:
    print(f'error: {refusal}', file=sys.stderr)
    if isinstance(refusal, StorageError):
      exit_abandoning_threads(refusal.exit_status)   # its read may still hang
    sys.exit(refusal.exit_status)

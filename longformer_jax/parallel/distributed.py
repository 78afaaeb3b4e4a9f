"""Several processes, one program: JAX's multi-controller runtime.

A TPU pod slice, a GPU cluster or this machine's loopback runs `train.py`
(or `eval.py`) once per host, every process the same command.
`parallel.multi_host=True` makes each process join the others through
`jax.distributed.initialize` before any device is touched; after that
`jax.devices()` lists every process's devices, the mesh spans them all, and
each process feeds only its own rows of the data (`data/stream_batch.py`,
`local_rows`) and writes its own shards of a checkpoint (Orbax).

Where the coordinator and the process ranks come from:

- `parallel.coordinator_address` ('host:port' of process 0),
  `parallel.num_processes` and `parallel.process_id`, when set (a loopback
  run on one machine; any launcher);
- otherwise the environment, as `jax.distributed.initialize()` reads it:
  TPU VM metadata (a pod slice), SLURM's `SLURM_*` variables (one task per
  host or per GPU, `srun`), Open MPI, Kubernetes, and
  `JAX_COORDINATOR_ADDRESS` for the coordinator.

On CPU the collectives between processes use Gloo (set explicitly: it is
the default of recent JAX versions only).
"""

import jax

from longformer_jax.parallel.parallel_config import ParallelConfig


def initialize(parallel: ParallelConfig) -> None:
  """Joins the other processes when `parallel.multi_host` (call before any JAX computation)."""
  if not parallel.multi_host:
    return
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
      coordinator_address=parallel.coordinator_address or None,
      num_processes=parallel.num_processes or None,
      process_id=None if parallel.process_id < 0 else parallel.process_id)

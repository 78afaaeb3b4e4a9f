"""One process of a multi-process test run (tests/parallel/test_multi_process.py).

  python tests/support/multi_process_worker.py MODE NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES OUT \
      [WORKDIR STEPS]

MODE `sum`: joins the others, builds the project's mesh over every process's
devices and prints a jitted reduction of an array that each process fed its
own rows of. MODE `train`: trains the tiny config of tests/support/tiny_models.py on
a schedule of TOTAL_STEPS steps (resuming from WORKDIR's checkpoint if any),
stops after STEPS and, from process 0, saves the parameters to OUT (.npz).
"""

import os
import sys

MODE, NUM_PROCESSES, PROCESS_ID, PORT, LOCAL_DEVICES, OUT = sys.argv[1:7]
TOTAL_STEPS = 5
os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={LOCAL_DEVICES}'
os.environ['JAX_PLATFORMS'] = 'cpu'
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)

import jax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from longformer_jax.parallel import distributed  # noqa: E402
from longformer_jax.parallel.parallel_config import ParallelConfig  # noqa: E402


def launch_settings() -> dict:
  if int(NUM_PROCESSES) == 1:
    return {}
  return dict(multi_host=True, coordinator_address=f'127.0.0.1:{PORT}',
              num_processes=int(NUM_PROCESSES), process_id=int(PROCESS_ID))


def global_sum() -> None:
  distributed.initialize(ParallelConfig.build(launch_settings(), 'parallel'))
  from longformer_jax.parallel.mesh import make_mesh
  mesh = make_mesh((-1, 1, 1))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(('data', 'fsdp')))
  rows = jax.device_count() // jax.process_count()
  local = np.arange(rows, dtype=np.float32) + rows * jax.process_index()
  total = jax.jit(lambda x: jnp.sum(x * x))(
      jax.make_array_from_process_local_data(sharding, local))
  print(f'process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.device_count()} devices, sum {float(total)}', flush=True)


def train(workdir: str, steps: int) -> None:
  import train as train_script
  from tests.support.tiny_models import tiny_config
  config = tiny_config(attention='xl', num_layers=1)
  # One schedule of TOTAL_STEPS for every run; a run stops (with a checkpoint) after `steps`.
  config.train.update(num_steps=TOTAL_STEPS, stop_after_steps=steps, checkpoint_every=3,
                      log_every=1)
  # Adam's eps of 1 makes the update about lr * gradient: gradients that differ
  # in their last bits (the order of a sum across processes) stay close, where
  # Adam's normalisation would blow the noise of a near-zero gradient up to lr.
  config.optimizer.update(learning_rate=0.5, warmup_steps=1, eps=1.0)
  config.parallel.update(launch_settings())
  state, _ = train_script.train(config, workdir)
  params = multihost_utils.process_allgather(state.params, tiled=True)
  if jax.process_index() == 0:
    flat = {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    np.savez(OUT, **flat)


if __name__ == '__main__':
  if MODE == 'sum':
    global_sum()
  else:
    train(sys.argv[7], int(sys.argv[8]))

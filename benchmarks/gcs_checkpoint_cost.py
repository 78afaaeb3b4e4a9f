"""What checkpointing to Cloud Storage costs a training run (a local GCS server).

  python benchmarks/gcs_checkpoint_cost.py [--steps=20] [--every=5] [--repeats=3]

Starts fake-gcs-server on the loopback address (tests/support/gcs_server.py) and runs
train.py's own `train()` on the default model (configs/default.py: 4 layers of
d_model 256, chunks of 256 bytes, batch 8) with evaluation off, in three
workdirs per repeat, in turns:
- `none`: a local workdir, no checkpoint until the last step;
- `local`: a local workdir, an async checkpoint every `--every` steps;
- `gcs`: a gs:// workdir on the server, the same checkpoints.
Every run also saves its last step, compiles the same programs and reads the
same data, so the difference of the medians over the number of extra saves
is what one save stalls training. The step time is measured from runs of
`--steps` and 2 x `--steps` steps without checkpoints. The restore rows time
`Checkpointer.restore` of the last checkpoint, from disk and from the
server (median of 5). The 2048^3 float32 matmul rate is measured before and
after. Timings are medians with (min-max).
"""

import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import app, flags, logging
import jax

from benchmarks.matmul_rate import measure
from longformer_jax import command_line
from longformer_jax.checkpoint.checkpointer import Checkpointer
from tests.support.gcs_server import BUCKET, create_bucket, start_server
import train as train_script

FLAGS = flags.FLAGS
flags.DEFINE_integer('steps', 20, 'Training steps per run.')
flags.DEFINE_integer('every', 5, 'Checkpoint every this many steps (local and gcs runs).')
flags.DEFINE_integer('repeats', 3, 'Runs of each kind.')


def run_config(steps: int, every: int):
  return command_line.experiment_config('configs/default.py', [
      ('train.num_steps', str(steps)), ('train.eval_every', '0'),
      ('train.log_every', str(steps)), ('train.checkpoint_every', str(every)),
      ('train.keep_checkpoints', '2')])


def timed_train(config, workdir: str) -> tuple:
  start = time.perf_counter()
  state, _ = train_script.train(config, workdir)
  return time.perf_counter() - start, state


def spread(values: list) -> str:
  return f'{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})'


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  steps, every = FLAGS.steps, FLAGS.every
  rate_before = measure()
  with tempfile.TemporaryFile() as log_file, tempfile.TemporaryDirectory() as local_root:
    process, url = start_server(log_file)
    os.environ.update(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                      GOOGLE_AUTH_TOKEN_FOR_TESTING='benchmark')
    try:
      create_bucket(url, BUCKET)
      times = {'none': [], 'none_x2': [], 'local': [], 'gcs': []}
      for repeat in range(FLAGS.repeats):
        runs = {'none': (run_config(steps, 10**9), f'{local_root}/none_{repeat}'),
                'none_x2': (run_config(2 * steps, 10**9), f'{local_root}/none_x2_{repeat}'),
                'local': (run_config(steps, every), f'{local_root}/local_{repeat}'),
                'gcs': (run_config(steps, every), f'gs://{BUCKET}/gcs_{repeat}')}
        for name, (config, workdir) in runs.items():
          seconds, state = timed_train(config, workdir)
          times[name].append(seconds)
          print(f'repeat {repeat} {name}: {seconds:.2f} s', flush=True)
      restores = {}
      for name, workdir in (('local', f'{local_root}/local_0'), ('gcs', f'gs://{BUCKET}/gcs_0')):
        restores[name] = []
        for _ in range(5):
          with Checkpointer(workdir, 2, async_save=False) as checkpointer:
            start = time.perf_counter()
            restored, _ = checkpointer.restore(None, state)
            jax.block_until_ready(restored)
            restores[name].append(time.perf_counter() - start)
        print(f'restore {name}: {spread(restores[name])} s', flush=True)
    finally:
      process.terminate()
      process.wait()
  rate_after = measure()
  saves = steps // every - 1        # beyond the last step's save, which every run makes
  step = [(b - a) / steps for a, b in zip(times['none'], times['none_x2'])]
  stall = {name: [(t - n) / saves for t, n in zip(times[name], times['none'])]
           for name in ('local', 'gcs')}
  size = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state)) / 2**20
  print(f'\nmatmul rate (median): {rate_before.median_flops_per_s / 1e9:.0f} GFLOP/s before, '
        f'{rate_after.median_flops_per_s / 1e9:.0f} after')
  print(f'default model, {steps} steps, a save every {every} ({saves} beyond the last step\'s); '
        f'train state {size:.1f} MiB; {FLAGS.repeats} repeats')
  print('| quantity | seconds, median (min-max) |\n|---|---:|')
  print(f'| one training step | {spread(step)} |')
  for name in ('none', 'local', 'gcs'):
    print(f'| run of {steps} steps, {name} | {spread(times[name])} |')
  for name in ('local', 'gcs'):
    print(f'| stall per save, {name} | {spread(stall[name])} |')
  for name in ('local', 'gcs'):
    print(f'| restore, {name} | {spread(restores[name])} |')
  ratio = statistics.median(stall['gcs']) / statistics.median(step)
  print(f'gcs_stall_per_save_over_step_time={ratio:.2f}')


if __name__ == '__main__':
  app.run(main)

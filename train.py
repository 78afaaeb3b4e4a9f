"""Trains a long-context language model or an encoder task; read top to bottom for the whole path.

  python train.py                                   # default config, built-in corpus
  python train.py --config=configs/NAME.py --workdir=DIR --config.key=value

The workdir receives checkpoints (orbax, params + optimizer + memory + RNG +
data position), `metrics.jsonl`, TensorBoard events and `config.json`
(written once the config is valid and the checkpoint, if any, restored). A
run started on a workdir with checkpoints resumes from the newest intact one.

`config.task` picks what is trained, a task of `longformer_jax/tasks/`
(`tasks/registry.py`): 'lm' (default; `tasks/lm.py`, with phased training
when `train.phases > 1`, Longformer sec. 4.2) or a fixed-size-example task,
'classification' | 'qa' | 'seq2seq' (LED) | 'image' (a causal decoder over
whole images, bits per dimension) | HIBERT's 'sentence_mask' (pretraining) |
'extractive' (summarisation), one file each in `tasks/`. The task gives the
loop its `TrainingTask` (`tasks/lm_training.py`, `tasks/example_training.py`);
every one runs in the one loop of `train/loop.py`. `train.init_from_hf`
fine-tunes imported weights: this script hands the task the importer
(`convert/hf_init.py`).

Exit status: 0 when training stopped at `train.num_steps` or
`train.stop_after_steps`; 143 (128 + SIGTERM) when SIGTERM (preemption,
`kill`) stopped it after saving a checkpoint, so a scheduler can tell a
preempted run (start it again to resume) from a finished one; 2 for a bad
setting (one line on stderr); 73 when another live run holds the workdir's
lease (`checkpoint/workdir_lease.py`: one line naming it, nothing written; checked before
JAX is imported, checkpoint/early_refusal.py, and again when the lease is taken); 75 when
the storage failed or did not answer within `checkpoint.storage_timeout_s` (one line
naming the operation, the path and the cause; docs/training.md, "When the storage fails").
"""

import json
import sys

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()
  # A workdir a live run holds is refused now, in one line, before JAX loads (seconds).
  from longformer_jax.checkpoint.early_refusal import refuse_a_held_workdir
  refuse_a_held_workdir(sys.argv)

from absl import app, flags
import jax
import ml_collections

from longformer_jax import command_line
from longformer_jax.checkpoint import run_lease
from longformer_jax.checkpoint.checkpoint_config import CheckpointConfig
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.convert import hf_init
from longformer_jax.experiment_config import validate_config
from longformer_jax.parallel import distributed
from longformer_jax.parallel.parallel_config import ParallelConfig
from longformer_jax.tasks.registry import task_for
from longformer_jax.train import loop
from longformer_jax.train.quiet_logs import show_own_info_only
from longformer_jax.train.run_directory import check_workdir

PREEMPTED_EXIT_STATUS = 128 + 15   # the shell's status of a process ended by SIGTERM


def train(config: ml_collections.ConfigDict, workdir: str):
  """Runs (or resumes) training; returns `(final TrainState, last logged metrics)`.

  The metrics hold `step`, `preempted` and, when the run completed with
  periodic evaluation, `final_valid`.
  """
  parallel = config.get('parallel')
  distributed.initialize(ParallelConfig.build(parallel.to_dict() if parallel else None, 'parallel'))
  validate_config(config, jax.device_count())
  # Every storage operation ends within checkpoint.storage_timeout_s (else exit status 75).
  settings = CheckpointConfig.build(config.checkpoint.to_dict(), 'checkpoint')
  StorageBound(settings.storage_timeout_s).call('checking --workdir', workdir,
                                                lambda: check_workdir(workdir), retry=True)
  # The one writer of the workdir from here on (a live holder: one line, exit status 73).
  with run_lease.held(workdir, settings) as lease:
    training = task_for(config.task).training_task(config, param_import=hf_init)
    return loop.run(training, config, workdir, lease)


def finish(result: dict) -> None:
  """Prints the final validation (if any); exits with status 143 when SIGTERM stopped training."""
  if 'final_valid' in result:
    print(json.dumps({'step': result['step'], 'valid': result['final_valid']}))
  if result['preempted']:
    print(f'stopped by SIGTERM at step {result["step"]} (checkpoint saved; run again to resume)',
          file=sys.stderr)
    sys.exit(PREEMPTED_EXIT_STATUS)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  show_own_info_only(debug=flags.FLAGS.debug)
  _, result = train(command_line.flag_config(), flags.FLAGS.workdir)
  finish(result)


if __name__ == '__main__':
  command_line.define_flags('Checkpoints and logs go here.')
  command_line.run(main)

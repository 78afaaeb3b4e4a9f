"""Scores a run workdir on lm-evaluation-harness tasks, memory carried across chunks.

  python -m longformer_jax.generation.harness --workdir=W --tasks=T1,T2 \
      [--include_path=DIR] [--limit=N] [--batch_size=B] [--step=S] [--chunk_len=C] \
      [--memory_size=M] [--metadata=JSON] [--debug]

The model, tokenizer and chunk length come from the run's `config.json` (trained
here, or imported with `python -m longformer_jax.convert.hf`), the parameters from
its latest checkpoint (or `--step`); every request is read as one document,
chunk by chunk with the model's memory (task_run.py, harness_lm.py). Prints lm-eval's
table and the memory used, and writes WORKDIR/harness/results.json. Bad input (an
unknown task, a workdir without checkpoints, a request longer than a model without
memory can read) is one line on stderr with exit status 2 (`--debug`: the traceback).
docs/evaluation.md, "lm-evaluation-harness".
"""

import sys

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import flags

from longformer_jax import command_line
from longformer_jax.config.errors import UserError
from longformer_jax.generation.harness.harness_settings import HarnessSettings, task_list
from longformer_jax.generation.harness.task_run import evaluate_workdir
from longformer_jax.train.quiet_logs import show_own_info_only

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the flags; called only when the module runs, so tests can import it."""
  flags.DEFINE_string('workdir', command_line.DEFAULT_WORKDIR, 'The run to evaluate.')
  flags.DEFINE_string('tasks', '', 'lm-eval tasks, groups or tags, comma-separated (globs too).')
  flags.DEFINE_string('include_path', '', 'A folder of more lm-eval task YAML files.')
  flags.DEFINE_float('limit', 0, 'Documents per task (0: all; below 1: a fraction).')
  flags.DEFINE_integer('batch_size', 0, "Requests scored side by side (0: the run's "
                       'data.eval_batch_size).')
  flags.DEFINE_integer('step', -1, 'Checkpoint step to read (-1: the latest).')
  flags.DEFINE_integer('chunk_len', 0, "Tokens per chunk (0: eval.py's: an import's context, "
                       'else the training chunk).')
  flags.DEFINE_integer('memory_size', 0, "The run's memory resized (0: as trained; kNN "
                       'memory_size, Attendre memory_size, sinks window, else mem_len).')
  flags.DEFINE_string('metadata', '', 'A JSON object handed to every task, e.g. '
                      '\'{"passkey_lengths": [4096, 16384]}\'.')
  flags.DEFINE_bool('debug', False, 'Show the traceback of input errors.')


def main(argv) -> None:
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {" ".join(argv[1:])}')
  show_own_info_only()
  overrides = [arg for arg in sys.argv[1:] if arg.startswith('--config')]
  if overrides:
    raise UserError(f'{overrides[0].split("=")[0]}: the harness reads the model from the '
                    "run's config.json and takes no --config settings")
  evaluate_workdir(HarnessSettings(
      workdir=FLAGS.workdir, tasks=tuple(task_list(FLAGS.tasks)),
      include_path=FLAGS.include_path, limit=FLAGS.limit, batch_size=FLAGS.batch_size,
      step=FLAGS.step, chunk_len=FLAGS.chunk_len, memory_size=FLAGS.memory_size,
      metadata=FLAGS.metadata))


if __name__ == '__main__':
  define_flags()
  command_line.run(main)

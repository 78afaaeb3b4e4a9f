"""`config.eval`: what eval.py scores (language-model runs; tasks use their own metrics)."""

import dataclasses

from longformer_jax.config.section import Section
from longformer_jax.evaluation import passkey_grid
from longformer_jax.train.train_config import parse_step_range


@dataclasses.dataclass(frozen=True)
class EvalConfig(Section):
  """The split, chunking, memory lengths and sweeps of eval.py."""
  split: str = 'valid'               # valid | test
  chunk_len: int = 0                 # 0: the training chunk_len
  mem_lens: str = ''                 # comma list, e.g. '0,128,512'; '' = training mem_len
  max_tokens: int = 0                # 0: the whole split
  batch_size: int = 0                # rows evaluated side by side; 0: the run's data.eval_batch_size
  step: int = -1                     # -1: latest checkpoint
  # Eval-time memory sweep, e.g. 'variant=attendre;policy=fifo,lra_max;memory_size=128,512'
  # (evaluation/memory_sweep.py); '' = off.
  memory_sweep: str = ''
  # Passkey retrieval over lengths x depths for each eval-time memory, e.g.
  # 'lengths=256,512,1024;depths=0,50,100;documents=8;memories=none,xl,attendre_lra_max'
  # (evaluation/passkey_grid.py); '' = off. Replaces the bits-per-byte evaluation.
  passkey_grid: str = ''
  # > 0: also score the far recurrences alone, the targets whose bigram last occurred more
  # than this many tokens back in the document (data/far_recurrences.py). 0 = off.
  far_distance: int = 0
  # Task image: also draw this many images position by position and save them as
  # DIR/eval/samples.png (evaluation/image_sampling.py); 0 = off.
  image_samples: int = 0
  sample_temperature: float = 1.0    # image samples: softmax temperature (0: the most likely)
  # lm-evaluation-harness tasks, comma-separated, e.g. 'passkey_4k,harness_choice': scores
  # them with the run's own memory instead of the bits-per-byte evaluation and writes
  # WORKDIR/harness/results.json (generation/harness/; docs/evaluation.md); '' = off.
  harness_tasks: str = ''
  harness_include_path: str = ''     # a folder of more task YAML files ('' = none)
  harness_limit: float = 0           # documents per task (0: all; below 1: a fraction)
  # 'FIRST,LAST': a jax.profiler trace of those batches (1-based) of the first evaluation
  # (bits per byte at the first of eval.mem_lens, or a task's split) under
  # WORKDIR/profile/eval (train/profiling.py; docs/training.md); '' = off.
  profile_batches: str = ''

  def validate(self, env) -> None:
    del env
    self.require(self.split in ('valid', 'test'), 'split', "must be 'valid' or 'test'")
    self.require(self.chunk_len >= 0, 'chunk_len', 'must be >= 0 (0: the training chunk_len)')
    self.require(self.max_tokens >= 0, 'max_tokens', 'must be >= 0 (0: the whole split)')
    self.require(self.batch_size >= 0, 'batch_size',
                 "must be >= 0 (0: the run's data.eval_batch_size)")
    self.require(self.step >= -1, 'step', 'must be a step or -1 (latest)')
    self.require(self.far_distance >= 0, 'far_distance', 'must be >= 0 (0: off)')
    self.require(self.image_samples >= 0, 'image_samples', 'must be >= 0 (0: off)')
    self.require(self.sample_temperature >= 0, 'sample_temperature', 'must be >= 0')
    try:
      parse_step_range(self.profile_batches)
    except ValueError as error:
      self.require(False, 'profile_batches', str(error))
    if self.passkey_grid:
      self.require(not self.memory_sweep, 'passkey_grid',
                   'cannot be combined with eval.memory_sweep: evaluate one, then the other')
      passkey_grid.parse_grid(self.passkey_grid, default_chunk=max(self.chunk_len, 1))
    if self.harness_tasks:
      for other in ('memory_sweep', 'passkey_grid', 'mem_lens'):
        self.require(not getattr(self, other), 'harness_tasks',
                     f'cannot be combined with eval.{other}: the harness reads the run with its '
                     'own memory (python -m longformer_jax.generation.harness --memory_size for '
                     'another size)')
    self.require(not (self.harness_include_path or self.harness_limit) or bool(self.harness_tasks),
                 'harness_include_path' if self.harness_include_path else 'harness_limit',
                 'is read only with eval.harness_tasks')
    self.require(self.harness_limit >= 0, 'harness_limit',
                 'must be >= 0 (0: every document; below 1: a fraction)')
    items = [item.strip() for item in self.mem_lens.split(',') if item.strip()]
    self.require(all(item.isdigit() for item in items), 'mem_lens',
                 'must be a comma-separated list of integers >= 0')

"""What one harness evaluation reads: the run, the tasks, and how the model reads them.

`python -m longformer_jax.generation.harness` fills `HarnessSettings` from its flags,
eval.py from `config.eval` (`from_eval_config`); `names` says how each entry point
spells a setting, so that a bad value is one line naming what to change
(`--tasks: ...` on the harness's command line, `config.eval.harness_tasks: ...` under
eval.py).
"""

import dataclasses
import json
from typing import Mapping, Optional

from longformer_jax.config.errors import ConfigError

# The harness's own command line (generation/harness/__main__.py).
FLAG_NAMES = {'workdir': '--workdir', 'tasks': '--tasks', 'include_path': '--include_path',
              'limit': '--limit', 'batch_size': '--batch_size', 'step': '--step',
              'chunk_len': '--chunk_len', 'memory_size': '--memory_size',
              'metadata': '--metadata'}
# eval.py's settings (evaluation/eval_config.py) for the same things.
EVAL_NAMES = {'workdir': '--workdir', 'tasks': 'eval.harness_tasks',
              'include_path': 'eval.harness_include_path', 'limit': 'eval.harness_limit',
              'batch_size': 'eval.batch_size', 'step': 'eval.step',
              'chunk_len': 'eval.chunk_len', 'memory_size': '--memory_size',
              'metadata': '--metadata'}


def task_list(text: str) -> list[str]:
  """'a, b,c' -> ['a', 'b', 'c'] (empty items dropped)."""
  return [name.strip() for name in text.split(',') if name.strip()]


@dataclasses.dataclass(frozen=True)
class HarnessSettings:
  """One harness evaluation.

  Attributes:
    workdir: the run (train.py's, or an import's from `convert.hf`).
    tasks: lm-eval task, group or tag names (the package's own tasks included).
    include_path: a folder of more task YAML files ('' = none).
    limit: documents per task (0 = all; below 1, a fraction of them).
    batch_size: requests scored side by side (0 = the run's `data.eval_batch_size`).
    step: the checkpoint step (-1 = the latest).
    chunk_len: tokens per chunk (0 = eval.py's: an import's context, else the training
      chunk).
    memory_size: the run's own memory resized (0 = as trained;
      evaluation/trained_memory.py: `memorizing.memory_size` for a kNN layer,
      `attendre.memory_size`, the sinks' window, else `mem_len`).
    metadata: JSON object handed to every task (e.g. `{"passkey_lengths": [4096]}`).
    names: how the entry point spells each setting, for error messages.
  """
  workdir: str
  tasks: tuple
  include_path: str = ''
  limit: float = 0
  batch_size: int = 0
  step: int = -1
  chunk_len: int = 0
  memory_size: int = 0
  metadata: str = ''
  names: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(FLAG_NAMES))

  def error(self, setting: str, rule: str) -> ConfigError:
    """The one-line error of `setting` (its entry point's spelling)."""
    return ConfigError(self.names[setting], rule)

  def validate(self) -> 'HarnessSettings':
    """Checks the values (not yet whether the tasks exist: task_run.py)."""
    if self.limit < 0:
      raise self.error('limit', f'{self.limit} must be >= 0 (0: every document)')
    for name in ('batch_size', 'chunk_len', 'memory_size'):
      if getattr(self, name) < 0:
        raise self.error(name, f'{getattr(self, name)} must be >= 0 (0: the run\'s own)')
    if self.step < -1:
      raise self.error('step', f'{self.step} must be a step or -1 (the latest)')
    self.task_metadata()
    return self

  def task_metadata(self) -> Optional[dict]:
    """The parsed `metadata` (None when not given)."""
    if not self.metadata:
      return None
    try:
      values = json.loads(self.metadata)
    except json.JSONDecodeError as error:
      raise self.error('metadata', f'is not JSON ({error.msg} at character {error.pos})') from None
    if not isinstance(values, dict):
      raise self.error('metadata', 'must be a JSON object, e.g. {"passkey_lengths": [4096]}')
    return values

  def lm_eval_limit(self):
    """`limit` as `simple_evaluate` takes it: None for all, an int count, or a fraction."""
    if not self.limit:
      return None
    return int(self.limit) if self.limit >= 1 else float(self.limit)

  @classmethod
  def from_eval_config(cls, eval_section, workdir: str) -> 'HarnessSettings':
    """eval.py's harness evaluation: `eval.harness_tasks` with `eval.harness_include_path`,
    `eval.harness_limit`, `eval.batch_size`, `eval.step` and `eval.chunk_len`."""
    return cls(workdir=workdir, tasks=tuple(task_list(eval_section.harness_tasks)),
               include_path=eval_section.harness_include_path,
               limit=eval_section.harness_limit, batch_size=eval_section.batch_size,
               step=eval_section.step, chunk_len=eval_section.chunk_len,
               names=dict(EVAL_NAMES)).validate()

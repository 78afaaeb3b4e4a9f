"""`config.train`: the loop's length, logging, evaluation, checkpoints and phases."""

import dataclasses

from longformer_jax.config.section import Section


def int_list(text) -> list[int]:
  """'300,300,300' (or an int, or '') -> [300, 300, 300]; ValueError on a bad item."""
  if isinstance(text, int):
    return [text]
  return [int(item) for item in str(text).split(',') if item.strip()]


def parse_step_range(text: str) -> 'tuple[int, int] | None':
  """'A,B' -> `(A, B)` with 1 <= A <= B; '' -> None; anything else raises `ValueError`."""
  text = str(text).strip()
  if not text:
    return None
  parts = [part.strip() for part in text.split(',')]
  try:
    first, last = (int(part) for part in parts)
  except ValueError:
    raise ValueError("must be 'FIRST,LAST' (two step numbers, e.g. '10,15') or ''") from None
  if not 1 <= first <= last:
    raise ValueError(f'must have 1 <= FIRST <= LAST, got {first},{last}')
  return first, last


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
  """The training loop."""
  num_steps: int = 900               # length of the schedule
  stop_after_steps: int = 0          # > 0: stop (and save) after this step; resume later
  log_every: int = 25
  eval_every: int = 300              # 0: no periodic evaluation
  eval_max_tokens: int = 65536       # language model: tokens per periodic evaluation (0: all)
  eval_max_examples: int = 0         # tasks: examples per periodic evaluation (0: all)
  checkpoint_every: int = 300
  keep_checkpoints: int = 3
  async_checkpointing: bool = True
  # Phased training (Longformer, sec. 4.2; train/phases.py): each phase multiplies the chunk
  # length and the window by these factors and the learning rate by phase_lr_factor.
  phases: int = 1
  phase_steps: str = ''              # comma list adding up to num_steps; '' = equal phases
  phase_length_factor: int = 2
  phase_window_factor: int = 2
  phase_lr_factor: float = 0.5
  # A fresh classification / qa / seq2seq run starts from this Hugging Face checkpoint's
  # encoder (Longformer) or encoder-decoder (LED) parameters (convert/hf_init.py); '' = off.
  init_from_hf: str = ''
  # A fresh classification run starts from the embeddings and encoder of the newest checkpoint
  # of this masked_pretraining run directory (self-pretraining, tasks/pretrained_encoder.py);
  # '' = off.
  init_from: str = ''
  # 'FIRST,LAST': write a jax.profiler trace of those steps (1-based, both included) under
  # WORKDIR/profile/train (train/profiling.py; docs/training.md); '' = off.
  profile_steps: str = ''

  def validate(self, env) -> None:
    del env
    for name in ('num_steps', 'log_every', 'checkpoint_every', 'keep_checkpoints', 'phases',
                 'phase_length_factor', 'phase_window_factor'):
      self.require(getattr(self, name) > 0, name, 'must be a positive integer')
    for name in ('stop_after_steps', 'eval_every', 'eval_max_tokens', 'eval_max_examples'):
      self.require(getattr(self, name) >= 0, name, 'must be >= 0 (0: off)')
    self.require(self.phase_lr_factor > 0, 'phase_lr_factor', 'must be > 0')
    try:
      window = parse_step_range(self.profile_steps)
    except ValueError as error:
      self.require(False, 'profile_steps', str(error))
    if window:
      self.require(window[1] <= self.num_steps, 'profile_steps',
                   f'must end by num_steps={self.num_steps}')
    try:
      steps = int_list(self.phase_steps)
    except ValueError:
      steps = None
    self.require(steps is not None, 'phase_steps', 'must be a comma-separated list of integers')
    if steps:
      self.require(len(steps) == self.phases and sum(steps) == self.num_steps
                   and min(steps) > 0, 'phase_steps',
                   f'must be {self.phases} positive step counts adding up to '
                   f'num_steps={self.num_steps}')
    else:
      self.require(self.num_steps % self.phases == 0, 'phase_steps',
                   f'is empty: num_steps={self.num_steps} must then divide into '
                   f'{self.phases} equal phases')

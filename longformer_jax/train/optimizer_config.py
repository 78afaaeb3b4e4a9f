"""`config.optimizer`: AdamW with warmup and cosine decay (`train/optimizer.py`)."""

import dataclasses

from longformer_jax.config.section import Section


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
  """AdamW, global-norm clipping, linear warmup then cosine decay."""
  learning_rate: float = 2e-3
  warmup_steps: int = 100
  end_learning_rate_fraction: float = 0.1   # the cosine ends at this fraction of the peak
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-8
  grad_clip_norm: float = 1.0
  grad_accum_steps: int = 1                 # micro-batches (over batch rows) per update
  # A parameter name whose copies in every layer stay equal, their gradients summed
  # (train/tied_parameters.py): '' none; T5's import sets 'relative_attention_bias'.
  tied_parameters: str = ''

  def validate(self, env) -> None:
    del env
    self.require(self.learning_rate > 0, 'learning_rate', 'must be > 0')
    self.require(self.warmup_steps >= 0, 'warmup_steps', 'must be >= 0')
    self.require(0 <= self.end_learning_rate_fraction <= 1, 'end_learning_rate_fraction',
                 'must be in [0, 1]')
    self.require(self.weight_decay >= 0, 'weight_decay', 'must be >= 0')
    self.require(0 <= self.b1 < 1, 'b1', 'must be in [0, 1)')
    self.require(0 <= self.b2 < 1, 'b2', 'must be in [0, 1)')
    self.require(self.eps > 0, 'eps', 'must be > 0')
    self.require(self.grad_clip_norm > 0, 'grad_clip_norm', 'must be > 0')
    self.require(self.grad_accum_steps >= 1, 'grad_accum_steps', 'must be a positive integer')

"""Checks the train loops make on the host: a non-finite loss or gradient stops the run."""

import math


class NonFiniteLossError(RuntimeError):
  """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


def check_finite(step: int, metrics: dict) -> None:
  for name in ('loss', 'grad_norm'):
    if not math.isfinite(metrics[name]):
      raise NonFiniteLossError(
          f'non-finite {name} ({metrics[name]}) at step {step}; stopping without saving. '
          f'The last good checkpoint is kept; lower optimizer.learning_rate or check the data.')

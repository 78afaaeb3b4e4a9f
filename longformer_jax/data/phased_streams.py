"""Training streams whose step length changes between phases (train/phases.py).

The streams are a `TrainStreams` read in units of phase 0's step (T0 tokens
per row); a step of k * T0 tokens is k consecutive units glued together
along the token axis. Consecutive units are consecutive windows of the same
streams (targets shifted across their boundaries), so a glued step equals
what a `TrainStreams` with k * T0 tokens per step would return at that
stream position, and a phase change continues exactly where the previous
phase stopped. The data position is the unit count (`state()`).
"""

import dataclasses

import numpy as np

from longformer_jax.data.stream_batch import StreamBatch
from longformer_jax.data.curriculum_streams import CurriculumStreams
from longformer_jax.data.train_streams import TrainStreams


def glue_batches(batches: list[StreamBatch]) -> StreamBatch:
  """Consecutive batches of the same rows -> one batch with all their tokens."""
  fields = [field.name for field in dataclasses.fields(StreamBatch)]
  return StreamBatch(**{name: np.concatenate([getattr(b, name) for b in batches], axis=1)
                        for name in fields})


class PhasedStreams:
  """`next_batch(units)`: the next `units * T0` tokens of every row."""

  def __init__(self, unit_streams: TrainStreams | CurriculumStreams):
    self.units = unit_streams

  def next_batch(self, units: int) -> StreamBatch:
    return glue_batches([self.units.next_batch() for _ in range(units)])

  def state(self) -> dict:
    return self.units.state()

  def restore(self, state: dict) -> None:
    self.units.restore(state)

"""What the data pipeline and the metrics need from a tokenizer."""

from typing import Iterable, Protocol

import numpy as np


class Tokenizer(Protocol):
  """What the data pipeline and the metrics need from a tokenizer."""
  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int

  def encode(self, data: bytes | str) -> np.ndarray:
    ...

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    ...

  def token_byte_lengths(self) -> np.ndarray:
    ...

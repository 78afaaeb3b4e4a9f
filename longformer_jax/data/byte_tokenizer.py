"""Byte-level tokenizer: every byte is a token, plus three special tokens."""

from typing import Iterable

import numpy as np


class ByteTokenizer:
  """Maps bytes 0..255 to ids 0..255; ids 256..258 are pad, BOS and EOS.

  Lossless for any byte string (UTF-8 or not). `encode` never adds specials;
  the stream batcher adds BOS in front of every document.
  """

  num_byte_ids = 256
  pad_id = 256
  bos_id = 257
  eos_id = 258
  vocab_size = 259

  def encode(self, data: bytes | str) -> np.ndarray:
    """Returns the byte ids of `data` (a str is UTF-8 encoded) as int32 [n]."""
    if isinstance(data, str):
      data = data.encode('utf-8')
    return np.frombuffer(bytes(data), dtype=np.uint8).astype(np.int32)

  def decode_bytes(self, ids: Iterable[int] | np.ndarray) -> bytes:
    """Returns the bytes of the byte ids in `ids`; specials are dropped."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    byte_ids = ids[(ids >= 0) & (ids < self.num_byte_ids)]
    return byte_ids.astype(np.uint8).tobytes()

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """Returns the text of `ids`; specials and out-of-range ids are dropped,
    invalid UTF-8 is replaced by U+FFFD."""
    return self.decode_bytes(ids).decode('utf-8', errors='replace')

  def token_byte_lengths(self) -> np.ndarray:
    """Bytes of raw text per token id, int32 [vocab_size]: 1 for byte ids,
    0 for specials. Sum over the targets to count bytes for bits per byte."""
    lengths = np.zeros([self.vocab_size], dtype=np.int32)
    lengths[:self.num_byte_ids] = 1
    return lengths

"""Raw texts of the encoder tasks before tokenization: QA texts, excerpts, a stable hash."""

import dataclasses
import hashlib


def stable_hash(text: bytes) -> int:
  """A 64-bit hash that is the same on every machine (not Python's salted `hash`)."""
  return int.from_bytes(hashlib.sha256(text).digest()[:8], 'big')


def whole_characters(text: bytes | str) -> bytes | str:
  """`text` without the partial UTF-8 characters a byte-length cut leaves (a text tokenizer,
  SentencePiece or tokenizer.json, reads whole characters only); `str` unchanged."""
  return text.decode('utf-8', 'ignore').encode('utf-8') if isinstance(text, bytes) else text


@dataclasses.dataclass(frozen=True)
class QAText:
  """A raw example: the context is `before + answer + after`."""
  question: bytes
  before: bytes
  answer: bytes
  after: bytes


def excerpt_around(data: bytes, begin: int, end: int, length: int, salt: bytes) -> QAText:
  """`data[begin:end]` as the answer of a `length`-byte excerpt of `data` (question left empty).

  The excerpt starts `stable_hash(salt) % room` bytes before the answer, so
  the answer is not always at the same place.
  """
  room = max(length - (end - begin), 1)
  start = max(0, begin - stable_hash(salt) % room)
  start = max(0, min(start, len(data) - length)) if len(data) > length else 0
  stop = start + length
  return QAText(b'', data[start:begin], data[begin:end], data[end:stop])

"""One raw document of a corpus: a name for error messages and its bytes."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Document:
  """A raw (untokenized) document.

  Attributes:
    name: a human-readable identifier, unique within its corpus split (a
      relative file path, a book id and title, ...); used in error messages.
    data: the document's raw bytes (UTF-8 for text corpora; the built-in
      corpus may hold any bytes).
  """
  name: str
  data: bytes

  def __repr__(self) -> str:
    return f'Document(name={self.name!r}, {len(self.data)} bytes)'

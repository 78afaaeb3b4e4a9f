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
    answer_start: for documents that end with the answer to a question
      (corpora passkey, attendre_qa), the byte offset where the answer
      starts; -1 for other documents. `data.loss_on='answer'` trains on
      the answers alone.
    answer_positions: for documents with many answers (corpus collisions), the byte
      offset of each labelled answer, a single token; `data.loss_on='answer'` counts
      those alone.
  """
  name: str
  data: bytes
  answer_start: int = -1
  answer_positions: tuple[int, ...] = ()

  def __repr__(self) -> str:
    return f'Document(name={self.name!r}, {len(self.data)} bytes)'

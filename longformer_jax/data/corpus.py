"""From `config.data` to tokenized documents: corpus and tokenizer dispatch."""

import math
from typing import Sequence

from absl import logging
import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import attendre_qa, collisions, passkey
from longformer_jax.data import stdlib_corpus
from longformer_jax.data import text_files_corpus
from longformer_jax.data import tfds_corpus
from longformer_jax.data.document import Document
from longformer_jax.data.tokenizer_interface import Tokenizer

CORPORA = ('stdlib', 'tiny_shakespeare', 'pg19', 'passkey', 'attendre_qa', 'collisions')


def load_corpus(data_config: ml_collections.ConfigDict,
                split: str) -> list[Document]:
  """The raw documents of `split` ('train' | 'valid' | 'test') of
  `data_config.corpus`; tfds corpora read `data_config.tfds_data_dir` (a `gs://` one
  through a local copy in `data_config.tfds_cache_dir`); `passkey`
  is synthetic (`data/passkey.py`), documents of `data.passkey_min_length` to
  `data.passkey_max_length` bytes (default: up to `data_config.chunk_len - 1`);
  `attendre_qa` is synthetic too (`data/attendre_qa.py`), its contexts of
  `data.passkey_min_length` to `data.passkey_max_length` bytes (default 256 to 1,024);
  `collisions` is the Expire-Span paper's object-collision task (`data/collisions.py`,
  shaped by `data.collisions`).

  A `data_config.corpus` with a `/` or a glob character (`*`, `?`, `[`) is a
  directory or glob of the user's own text files (`text_files_corpus`).

  Raises:
    ConfigError: unknown corpus or split, tfds data not prepared, or no
      usable text files.
  """
  name = data_config.corpus
  if name == 'stdlib':
    return stdlib_corpus.load_documents(split)
  if name in ('tiny_shakespeare', 'pg19'):
    return tfds_corpus.load_documents(name, split, data_config.tfds_data_dir,
                                      data_config.tfds_cache_dir)
  if name == 'passkey':       # synthetic passkey retrieval (lengths: data.passkey_*)
    return passkey.load_documents(
        split, data_config.passkey_max_length or data_config.chunk_len - 1,
        min_length=data_config.passkey_min_length, spread=data_config.passkey_lengths,
        max_key='data.passkey_max_length' if data_config.passkey_max_length else 'data.chunk_len')
  if name == 'attendre_qa':   # question-first reading comprehension (data/attendre_qa.py)
    return attendre_qa.load_documents(split, data_config.passkey_max_length,
                                      data_config.passkey_min_length, data_config.passkey_lengths)
  if name == 'collisions':    # particles on a grid, queried for their last collision
    return collisions.load_documents(
        collisions.CollisionsConfig.build(data_config.collisions, 'data.collisions'), split)
  if text_files_corpus.is_text_files_corpus(name):
    return text_files_corpus.load_documents(name, split)
  raise ConfigError('data.corpus',
                    f'unknown corpus {name!r}; expected one of {CORPORA}, or a '
                    f'directory or glob of text files with a / in it (./{name})')


def curriculum_documents(data_config: ml_collections.ConfigDict) -> list[Document]:
  """The first stage of a length curriculum (`data.passkey_curriculum_steps`): the training
  documents up to `data.passkey_curriculum_max_length`. Corpus passkey: up to that many tokens
  (0: `data.chunk_len - 1`, one document per chunk), uniform. Corpus attendre_qa: contexts of
  `data.passkey_min_length` to that many bytes (0: 1,024), spread as `data.passkey_lengths`.

  Raises:
    ConfigError: a corpus without a length curriculum ('data.passkey_curriculum_steps').
  """
  longest = data_config.passkey_curriculum_max_length
  if data_config.corpus == 'passkey':
    return passkey.load_documents(
        'train', longest or data_config.chunk_len - 1,
        max_key='data.passkey_curriculum_max_length' if longest else 'data.chunk_len')
  if data_config.corpus == 'attendre_qa':
    return attendre_qa.load_documents('train', longest or attendre_qa.DEFAULT_MAX_CONTEXT,
                                      data_config.passkey_min_length,
                                      data_config.passkey_lengths)
  raise ConfigError('data.passkey_curriculum_steps',
                    f"is read only by corpus='passkey' or 'attendre_qa' "
                    f'(corpus is {data_config.corpus!r})')


def tokenize_documents(tokenizer: Tokenizer, documents: Sequence[Document],
                       skip_undecodable: bool = False) -> list[np.ndarray]:
  """Encodes each document (no BOS; the stream batcher adds it).

  Args:
    skip_undecodable: skip (with a warning naming them) documents the
      tokenizer cannot encode, e.g. the few non-UTF-8 files of the standard
      library under SentencePiece (`data.skip_undecodable`).

  Returns:
    One int32 [num_tokens] array per document, in order.

  Raises:
    ValueError: naming the document, if it is empty, encodes to no tokens,
      or cannot be encoded (e.g. non-UTF-8 bytes with SentencePiece) and
      `skip_undecodable` is False.
  """
  encoded, skipped = [], []
  for document in documents:
    try:
      encoded.append(_tokenize_document(tokenizer, document))
    except ValueError as error:
      if not skip_undecodable:
        raise ValueError(f'{error} (set data.skip_undecodable=True to skip such '
                         f'documents)') from error
      skipped.append(document.name)
  if skipped:
    logging.warning('Skipped %d documents the tokenizer cannot encode: %s',
                    len(skipped), ', '.join(skipped))
  return encoded


def tokenize_answered_documents(tokenizer: Tokenizer, documents: Sequence[Document]
                                ) -> tuple[list[np.ndarray], list[int]]:
  """Encodes each document as its prompt's tokens followed by its answer's (`data.loss_on='answer'`).

  The two parts are encoded apart, so the answer's first token is exact with any tokenizer
  (for the byte tokenizer the tokens equal `tokenize_documents`').

  Returns:
    The int32 [num_tokens] arrays, and per document the index of its answer's first token.

  Raises:
    ValueError: naming the document, if it has no answer (`Document.answer_start` < 1),
      or a part is empty or cannot be encoded.
  """
  encoded, starts = [], []
  for document in documents:
    start = document.answer_start
    if not 0 < start < len(document.data):
      raise ValueError(f'document {document.name!r} has no answer to train on '
                       f'(answer_start={start}); data.loss_on=\'answer\' needs one')
    prompt, answer = (_tokenize_document(tokenizer, Document(document.name, part))
                      for part in (document.data[:start], document.data[start:]))
    encoded.append(np.concatenate([prompt, answer]).astype(np.int32))
    starts.append(prompt.size)
  return encoded, starts


def byte_answer_masks(tokenizer: Tokenizer, documents: Sequence[Document]
                      ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Encodes documents with many single-byte answers (`Document.answer_positions`, corpus
  collisions) and marks them: the int32 [n] tokens and the bool [n] answer mask of each (a
  document without answers, an episode without a collision, trains nothing).

  Raises:
    ValueError: naming the document, if the tokenizer does not keep one token per byte.
  """
  encoded, masks = [], []
  for document in documents:
    tokens = _tokenize_document(tokenizer, document)
    if tokens.size != len(document.data):
      raise ValueError(f'document {document.name!r}: its answers are byte offsets, so it '
                       f'needs the byte tokenizer (one token per byte)')
    mask = np.zeros([tokens.size], bool)
    mask[np.asarray(document.answer_positions, np.int64)] = True
    encoded.append(tokens)
    masks.append(mask)
  return encoded, masks


def cut_into_pieces(docs: Sequence[np.ndarray], min_count: int) -> list[np.ndarray]:
  """At least `min_count` documents: each document cut into k contiguous pieces.

  Stream batching gives every row at least one document per epoch, so a
  corpus of a few long documents (tiny_shakespeare has one per split) is
  cut into `k = ceil(min_count / len(docs))` near-equal pieces each, as
  Transformer-XL cuts enwik8 into one contiguous part per row. Corpora
  with enough documents are returned unchanged.
  """
  if len(docs) >= min_count or not docs:
    return list(docs)
  k = math.ceil(min_count / len(docs))
  pieces = [piece for doc in docs for piece in np.array_split(doc, k) if piece.size]
  if len(pieces) < min_count:
    raise ValueError(f'{len(docs)} documents of {sum(d.size for d in docs)} tokens cannot be '
                     f'cut into {min_count} non-empty pieces')
  return pieces


def _tokenize_document(tokenizer: Tokenizer, document: Document) -> np.ndarray:
  if not document.data:
    raise ValueError(f'document {document.name!r} is empty')
  try:
    tokens = tokenizer.encode(document.data)
  except ValueError as error:
    raise ValueError(
        f'cannot tokenize document {document.name!r}: {error}') from error
  if tokens.size == 0:
    raise ValueError(f'document {document.name!r} encodes to no tokens')
  return tokens

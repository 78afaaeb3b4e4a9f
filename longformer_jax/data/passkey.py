"""Passkey retrieval documents: filler text with a 5-digit key hidden at a chosen depth.

The synthetic test of Mohtashami & Jaggi (2023, "Landmark Attention", sec. 4.2):
a fixed set of plain sentences repeated as filler, one needle sentence
inserted at a depth of the filler, and a question at the end whose answer is
the key:

  <filler[:before]> The pass key is 12345. Remember it. 12345 is the pass key. <filler[before:]>
   What is the pass key? The pass key is 12345.

A document of `length` tokens has exactly `length` tokens (without the BOS
that streams and evaluation put in front); the filler is cut so that the
total fits, and the needle starts at token `before = round(depth * F)` of
the document, where F is the number of filler tokens (depth 0: the needle
opens the document; depth 1: it comes right before the question). The
pieces (filler, needle, question, key, final '.') are encoded one by one and
concatenated, so the length is exact with any tokenizer; with the byte
tokenizer tokens are bytes. The key is a random 5-digit number (10000-99999)
of `np.random.default_rng([seed, ...])`, so a document is a pure function of
its seed, length and depth.

The built-in corpus `passkey` (`data.corpus='passkey'`, `load_documents`)
holds such documents of random lengths, by default up to `data.chunk_len - 1`
bytes (one document plus its BOS fits a training chunk with the byte
tokenizer; a SentencePiece model makes them fewer tokens), or from
`data.passkey_min_length` to `data.passkey_max_length` (documents longer
than the chunk, read chunk by chunk with the memory carried: a model must
keep the needle in its memory to answer), and uniform random depths:
16,384 training documents, which the training streams reshuffle every epoch
(an endless stream), and 256 each for valid and test, with fixed seeds per
split.
"""

import dataclasses
from typing import Callable

import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.document import Document

FILLER = ('The grass is green. The sky is blue. The sun is yellow. Here we go. '
          'There and back again. ')
NEEDLE = ' The pass key is {key}. Remember it. {key} is the pass key. '
QUESTION = ' What is the pass key? The pass key is '
ANSWER_END = '.'
KEY_DIGITS = 5

SPLITS = ('train', 'valid', 'test')
SPLIT_SEEDS = {'train': 1001, 'valid': 1002, 'test': 1003}
SPLIT_SIZES = {'train': 16384, 'valid': 256, 'test': 256}

Encode = Callable[[str], np.ndarray]


def byte_encode(text: str) -> np.ndarray:
  """UTF-8 bytes as int32 tokens (what the byte tokenizer gives)."""
  return np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class PasskeyDocument:
  """One passkey document.

  Attributes:
    tokens: int32 `[length]`, without BOS.
    key: the 5 digits, e.g. '12345'.
    depth: the requested depth in [0, 1].
    needle_start: index in `tokens` of the needle's first token.
    answer_start: index in `tokens` of the answer's (the final key's) first token.
    answer_len: tokens of the answer (5 with the byte tokenizer).
    needle_len: tokens of the needle sentence.
  """
  tokens: np.ndarray
  key: str
  depth: float
  needle_start: int
  answer_start: int
  answer_len: int
  needle_len: int = 0

  @property
  def answer(self) -> np.ndarray:
    return self.tokens[self.answer_start:self.answer_start + self.answer_len]


def random_key(rng: np.random.Generator) -> str:
  """A 5-digit key, 10000-99999."""
  return str(int(rng.integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS)))


def fixed_tokens(key: str, encode: Encode = byte_encode) -> int:
  """Tokens of a document that are not filler (needle, question, answer, final '.')."""
  return sum(encode(text).size for text in (NEEDLE.format(key=key), QUESTION, key, ANSWER_END))


def minimum_length(encode: Encode = byte_encode) -> int:
  """The shortest document length that holds every key (no filler)."""
  return max(fixed_tokens(key, encode) for key in ('10000', '99999'))


def filler_tokens(count: int, encode: Encode = byte_encode) -> np.ndarray:
  """The first `count` tokens of the repeated filler sentences."""
  sentence = encode(FILLER)
  repeats = -(-count // max(sentence.size, 1))
  return np.tile(sentence, max(repeats, 0))[:count]


def passkey_document(length: int, depth: float, key: str,
                     encode: Encode = byte_encode) -> PasskeyDocument:
  """The document of exactly `length` tokens with `key` at `depth` (module docstring).

  Raises:
    ValueError: `depth` outside [0, 1], or `length` too short to hold the
      needle, question and answer.
  """
  if not 0.0 <= depth <= 1.0:
    raise ValueError(f'depth must be in [0, 1], got {depth}')
  needle, question = encode(NEEDLE.format(key=key)), encode(QUESTION)
  answer, end = encode(key), encode(ANSWER_END)
  num_filler = length - (needle.size + question.size + answer.size + end.size)
  if num_filler < 0:
    raise ValueError(f'a passkey document needs at least {length - num_filler} tokens, '
                     f'got length {length}')
  filler = filler_tokens(num_filler, encode)
  before = int(round(depth * num_filler))
  tokens = np.concatenate([filler[:before], needle, filler[before:], question, answer, end])
  return PasskeyDocument(tokens=tokens.astype(np.int32), key=key, depth=float(depth),
                         needle_start=before, answer_start=length - end.size - answer.size,
                         answer_len=answer.size, needle_len=needle.size)


def seeded_document(seed: int, length: int, depth: float, index: int,
                    encode: Encode = byte_encode) -> PasskeyDocument:
  """Document `index` of a grid cell: its key from `default_rng([seed, length, depth per
  mille, index])`, the same for every memory and tokenizer."""
  rng = np.random.default_rng([seed, length, int(round(depth * 1000)), index])
  return passkey_document(length, depth, random_key(rng), encode)


def document_length(rng: np.random.Generator, shortest: int, longest: int, spread: str) -> int:
  """A corpus document's length in [shortest, longest]: uniform, or with `spread='log_uniform'`
  log-uniform (as many documents per octave). Shared with data/attendre_qa.py."""
  if spread == 'log_uniform':
    return int(round(np.exp(rng.uniform(np.log(shortest), np.log(longest)))))
  return int(rng.integers(shortest, longest + 1))


def load_documents(split: str, max_length: int, min_length: int = 0, spread: str = 'uniform',
                   max_key: str = 'data.chunk_len') -> list[Document]:
  """The `passkey` corpus split: `SPLIT_SIZES[split]` byte documents, depths uniform in
  [0, 1], lengths in [max(min_length, minimum_length()), max_length]: uniform, or with
  `spread='log_uniform'` log-uniform (as many documents per octave of length, so short
  documents, dense in answers, and long ones, whose needle lies chunks back, both abound).

  Raises:
    ConfigError: unknown split ('eval.split'), or `max_length` below the
      minimum (`max_key`, the setting that gave it).
  """
  if split not in SPLITS:
    raise ConfigError('eval.split', f'unknown split {split!r} of the passkey corpus; '
                      f'expected one of {SPLITS}')
  shortest = max(minimum_length(), min_length)
  if max_length < shortest:
    raise ConfigError(max_key, f'corpus passkey needs documents of at least {shortest} '
                      f'tokens (chunks of {shortest + 1} with BOS when '
                      f'data.passkey_max_length is 0), got {max_length}')
  documents = []
  for index in range(SPLIT_SIZES[split]):
    rng = np.random.default_rng([SPLIT_SEEDS[split], index])
    length = document_length(rng, shortest, max_length, spread)
    depth = float(rng.uniform(0.0, 1.0))
    document = passkey_document(length, depth, random_key(rng))
    documents.append(Document(name=f'passkey/{split}/{index}',
                              data=document.tokens.astype(np.uint8).tobytes(),
                              answer_start=document.answer_start))
  return documents

"""SentencePiece tokenizer: load a `.model` file, or train one from a corpus.

Models trained here are lossless for UTF-8 text: no normalization, no extra
whitespace removal, no dummy prefix, and byte fallback for characters
outside the vocabulary. So `decode(encode(text)) == text` (except for a
literal U+2581 '▁', which SentencePiece reserves for the space), and the
bytes per token from `token_byte_lengths()` add up to the UTF-8 length of
the text, which is what bits per byte needs.

Command line (trains on the train split of a corpus, prints the .model path):

  python -m longformer_jax.data.sentencepiece_tokenizer \
      --corpus=stdlib --vocab_size=4096 --out=/tmp/spm/stdlib4k \
      [--max_documents=N] [--max_sentences=N] [--num_threads=N] \
      [--tfds_data_dir=DIR] [--tfds_cache_dir=DIR]

Training is reproducible: the same corpus, flags and thread count give the
same .model file, byte for byte.
"""

import argparse
import os
import random
import sys
from typing import Iterable, Iterator, Sequence

import ml_collections
import numpy as np
import sentencepiece as spm

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import corpus
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.document import Document
from longformer_jax.storage import paths

MODEL_KEY = 'data.sentencepiece_model'
SPACE_PIECE = '\u2581'  # '▁', SentencePiece's stand-in for a space.

# Ids of the special pieces in models trained by `train_sentencepiece`.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


class SentencePieceTokenizer:
  """A SentencePiece model with the same interface as `ByteTokenizer`."""

  def __init__(self, model_path: str):
    """Loads the model at `model_path`; raises `ConfigError` naming the path
    if it is missing, is not a SentencePiece model, or has no pad piece.

    Without a BOS piece (T5's `spiece.model`: pad 0, EOS 1, unk 2),
    `has_bos` is False and `bos_id` is the pad id, T5's decoder start token;
    `make_tokenizer` refuses such a model for tasks that need BOS."""
    self.model_path = str(model_path)
    self._processor = _load_processor(self.model_path)
    self.vocab_size = int(self._processor.vocab_size())
    self.pad_id = int(self._processor.pad_id())
    self.bos_id = int(self._processor.bos_id())
    self.eos_id = int(self._processor.eos_id())  # -1 if the model has none.
    _require_pad(self.model_path, self.pad_id)
    self.has_bos = self.bos_id >= 0
    if not self.has_bos:
      self.bos_id = self.pad_id

  def missing_bos(self) -> tuple[str, str]:
    """`(config key, what is missing)` for the error of a task that needs BOS."""
    return MODEL_KEY, f'the model {self.model_path!r} defines no BOS piece (bos_id=-1)'

  @classmethod
  def load(cls, path: str) -> 'SentencePieceTokenizer':
    """Loads a `.model` file (see `__init__` for the errors)."""
    return cls(path)

  def encode(self, data: bytes | str) -> np.ndarray:
    """Returns the piece ids of `data` as int32 [n], no BOS/EOS added.

    Raises:
      ValueError: `data` is bytes that are not valid UTF-8.
    """
    text = _as_text(data)
    return np.asarray(self._processor.encode(text, out_type=int),
                      dtype=np.int32)

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """Returns the text of `ids`; specials and out-of-range ids are dropped."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    ids = ids[(ids >= 0) & (ids < self.vocab_size)]
    ids = ids[~np.isin(ids, [self.pad_id, self.bos_id, self.eos_id])]
    return self._processor.decode(ids.tolist())

  def token_byte_lengths(self) -> np.ndarray:
    """Raw-text bytes per token id, int32 [vocab_size].

    UTF-8 length of the piece with '▁' counted as one (space) byte; byte
    fallback pieces `<0xNN>` count 1; control and unknown pieces count 0.
    """
    return np.array(
        [self._piece_byte_length(i) for i in range(self.vocab_size)],
        dtype=np.int32)

  def _piece_byte_length(self, piece_id: int) -> int:
    processor = self._processor
    if processor.is_control(piece_id) or processor.is_unknown(piece_id):
      return 0
    if processor.is_unused(piece_id):
      return 0
    if processor.is_byte(piece_id):
      return 1
    piece = processor.id_to_piece(piece_id)
    return len(piece.replace(SPACE_PIECE, ' ').encode('utf-8'))


def _load_processor(path: str) -> spm.SentencePieceProcessor:
  """Loads a SentencePiece model, raising `ConfigError` naming `path`."""
  if not path:
    raise ConfigError(MODEL_KEY, 'is empty; set it to the path of a '
                      'SentencePiece .model file (train one with `python -m '
                      'longformer_jax.data.sentencepiece_tokenizer`)')
  paths.check_bucket(path, MODEL_KEY)
  model_file = paths.as_path(path)
  if not model_file.is_file():
    raise ConfigError(MODEL_KEY, f'no SentencePiece model file at {path!r}')
  processor = spm.SentencePieceProcessor()
  try:   # from its bytes: the same for a local file and a gs:// object
    processor.LoadFromSerializedProto(model_file.read_bytes())
  except (RuntimeError, OSError) as error:
    raise ConfigError(
        MODEL_KEY, f'{path!r} is not a valid SentencePiece model file '
        f'({error})') from error
  return processor


def _require_pad(path: str, pad_id: int) -> None:
  """Batches are padded with the pad piece (and masked where it stands)."""
  if pad_id < 0:
    raise ConfigError(
        MODEL_KEY, f'the model {path!r} defines no pad piece (pad_id=-1), which '
        'pads batches; use its tokenizer.json, or train one with '
        '`python -m longformer_jax.data.sentencepiece_tokenizer`')


def _as_text(data: bytes | str) -> str:
  """Decodes UTF-8 bytes strictly; a ValueError says where it is invalid."""
  if isinstance(data, str):
    return data
  try:
    return bytes(data).decode('utf-8')
  except UnicodeDecodeError as error:
    raise ValueError(
        'input is not valid UTF-8 (SentencePiece encodes text only): '
        f'{error.reason} at byte offset {error.start}') from None


# ---- training -------------------------------------------------------------


def _document_lines(documents: Iterable[bytes | Document]) -> Iterator[str]:
  """Yields the non-empty lines of the documents, in order.

  Raises:
    ValueError: a document is empty or not valid UTF-8 (named by its index,
      and name for `Document`s).
  """
  for index, document in enumerate(documents):
    name, data = _name_and_data(index, document)
    for line in _document_text(name, data).splitlines():
      if line:
        yield line


def sample_lines(lines: Iterable[str], max_lines: int,
                 seed: int) -> list[str]:
  """A uniform sample of at most `max_lines` lines, kept in input order.

  Reservoir sampling (Vitter's Algorithm R) in one pass, with Python's
  seeded Mersenne Twister: the same lines and seed give the same sample in
  every process. (SentencePiece's own `shuffle_input_sentence` sampling
  ignores `set_random_generator_seed`: two processes with the same seed
  train different models.)
  """
  if max_lines <= 0:
    raise ValueError(f'max_lines must be positive, got {max_lines}')
  rng = random.Random(seed)
  reservoir: list[tuple[int, str]] = []
  for index, line in enumerate(lines):
    if index < max_lines:
      reservoir.append((index, line))
      continue
    # Line `index` enters with probability max_lines / (index + 1).
    slot = rng.randrange(index + 1)
    if slot < max_lines:
      reservoir[slot] = (index, line)
  reservoir.sort()
  return [line for _, line in reservoir]


def _name_and_data(index: int, document: bytes | Document) -> tuple[str, bytes]:
  if isinstance(document, Document):
    return f'{document.name!r} (index {index})', document.data
  return f'index {index}', document


def _document_text(name: str, data: bytes) -> str:
  if not data:
    raise ValueError(f'document {name} is empty')
  try:
    return _as_text(data)
  except ValueError as error:
    raise ValueError(f'document {name}: {error}') from None


def train_sentencepiece(documents: Iterable[bytes | Document],
                        model_prefix: str,
                        vocab_size: int,
                        model_type: str = 'unigram',
                        max_sentences: int = 1_000_000,
                        character_coverage: float = 0.9995,
                        num_threads: int = 0,
                        seed: int = 0) -> str:
  """Trains a lossless SentencePiece model in-process.

  Every non-empty line of every document is one training sentence; at most
  `max_sentences` of them, sampled uniformly by `sample_lines`, are used.
  The same documents, arguments and `num_threads` give the same model file
  in any process (the trainer's sums depend on how it splits the work).

  Args:
    documents: raw UTF-8 documents (bytes, or `Document`s for better errors).
    model_prefix: writes `{model_prefix}.model` and `{model_prefix}.vocab`;
      the parent folder is created.
    vocab_size: pieces in the model, including 4 specials and 256 byte pieces.
    model_type: 'unigram' | 'bpe' | 'char' | 'word'.
    max_sentences: cap on the sampled training sentences.
    character_coverage: fraction of characters covered by character pieces.
    num_threads: trainer threads; 0 means the number of CPUs.
    seed: seed of the line sample (and of the trainer's own generator).

  Returns:
    The path of the written `.model` file. Its ids: pad 0, unk 1, BOS 2, EOS 3.

  Raises:
    ValueError: a document is empty or not valid UTF-8 (named by its index,
      and name for `Document`s), or the trainer rejects the settings.
  """
  if vocab_size <= 0:
    raise ValueError(f'vocab_size must be positive, got {vocab_size}')
  if max_sentences <= 0:
    raise ValueError(f'max_sentences must be positive, got {max_sentences}')
  sentences = sample_lines(_document_lines(documents), max_sentences, seed)
  if not sentences:
    raise ValueError('the documents hold no non-empty line to train on')
  parent = os.path.dirname(os.path.abspath(model_prefix))
  os.makedirs(parent, exist_ok=True)
  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        byte_fallback=True,
        normalization_rule_name='identity',
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        character_coverage=character_coverage,
        input_sentence_size=0,  # Sampled above, reproducibly.
        shuffle_input_sentence=False,
        max_sentence_length=16384,
        num_threads=num_threads or (os.cpu_count() or 1),
        minloglevel=2,
    )
  except RuntimeError as error:
    raise ValueError(f'SentencePiece training failed: {error}') from error
  return f'{model_prefix}.model'


# ---- command line ---------------------------------------------------------


def _usable_for_training(documents: Sequence[Document]) -> list[Document]:
  """Drops empty and non-UTF-8 documents, saying which on stderr."""
  usable, skipped = [], []
  for document in documents:
    try:
      _document_text(document.name, document.data)
    except ValueError:
      skipped.append(document.name)
      continue
    usable.append(document)
  if skipped:
    print(f'skipped {len(skipped)} empty or non-UTF-8 documents: '
          f'{", ".join(skipped)}', file=sys.stderr)
  return usable


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description='Trains a SentencePiece model on the train split of a '
      'corpus and prints the path of the .model file.')
  parser.add_argument('--corpus', default='stdlib',
                      help='stdlib | tiny_shakespeare | pg19 | passkey | attendre_qa')
  parser.add_argument('--vocab_size', type=int, default=4096)
  parser.add_argument('--out', required=True,
                      help='output path prefix (writes PREFIX.model)')
  parser.add_argument('--model_type', default='unigram',
                      help='unigram | bpe | char | word')
  parser.add_argument('--max_documents', type=int, default=0,
                      help='use only the first N documents (0: all)')
  parser.add_argument('--max_sentences', type=int, default=1_000_000,
                      help='cap on the sampled training lines')
  parser.add_argument('--num_threads', type=int, default=0,
                      help='trainer threads (0: all CPUs); the model file '
                      'depends on it, so fix it to reproduce a model on '
                      'another machine')
  parser.add_argument('--tfds_data_dir', default='',
                      help='prepared tensorflow-datasets folder (tfds corpora), or gs://')
  parser.add_argument('--tfds_cache_dir', default=DataConfig.tfds_cache_dir,
                      help='where a gs:// tfds_data_dir\'s dataset is copied to be read')
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> str:
  """Runs the command line; returns (and prints) the .model path."""
  args = _parse_args(argv)
  # Every data setting at its default but these: the corpora read their own (passkey and
  # attendre_qa their lengths).
  data_config = ml_collections.ConfigDict(DataConfig.build(
      {'corpus': args.corpus, 'tfds_data_dir': args.tfds_data_dir,
       'tfds_cache_dir': args.tfds_cache_dir}, 'data').to_dict())
  documents = corpus.load_corpus(data_config, 'train')
  if args.max_documents > 0:
    documents = documents[:args.max_documents]
  path = train_sentencepiece(
      _usable_for_training(documents), args.out, args.vocab_size,
      model_type=args.model_type, max_sentences=args.max_sentences,
      num_threads=args.num_threads)
  print(path)
  return path


if __name__ == '__main__':
  main()

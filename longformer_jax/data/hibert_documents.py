"""Documents split into sentences for HIBERT (Zhang et al., 2019): sources, the splitter, arrays.

A `SentenceDocument` is a list of sentences (str) and, for the extractive
task, a reference summary (str). Sources (`data.corpus`):

  * `stdlib` (built in): the docstrings (module, class, function) of the
    standard library's `.py` files, one document each (`stdlib_corpus`: the
    split of a docstring is the split of its file);
  * a path or glob (`text_files_corpus`): each of the user's text files is
    one document (empty or non-UTF-8 files are skipped there, with a warning);
  * `cnn_dailymail` (tensorflow-datasets, prepared under `data.tfds_data_dir`):
    `article` -> sentences, `highlights` -> the reference summary.

Sentence rule (`split_sentences`): paragraphs are separated by blank lines;
inside a paragraph every run of whitespace becomes one space, and a sentence
ends after '.', '!' or '?' followed by whitespace. So "e.g. this" splits too:
the rule is simple on purpose.

For the extractive task of the built-in sources the reference summary is the
first sentence (a docstring's summary line), removed from the document.
Documents with fewer than 2 sentences (after that removal) are skipped and
counted in one log line.

Arrays (`sentence_arrays`, `[n, sentences, tokens]`): each sentence is
`[BOS] + its tokens` cut to `max_sentence_tokens`, padded with PAD; the
decoder targets are the tokens then EOS (`[n, sentences, tokens]`, PAD after);
documents keep their first `max_sentences` sentences.
"""

import ast
import dataclasses
import functools
import re

from absl import logging
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import stdlib_corpus, text_files_corpus, tfds_corpus

TFDS_SPLITS = {'train': 'train', 'valid': 'validation', 'test': 'test'}
MIN_SENTENCES = 2
_PARAGRAPH_BREAK = re.compile(r'\n[ \t\r\f\v]*\n')
_SENTENCE_END = re.compile(r'(?<=[.!?])\s+')


@dataclasses.dataclass(frozen=True)
class SentenceDocument:
  """A document as sentences; `summary` is the reference summary ('' when there is none)."""
  name: str
  sentences: tuple
  summary: str = ''


def split_sentences(text: str) -> list[str]:
  """Sentences of `text`: blank lines end paragraphs, and '.', '!', '?' + whitespace end sentences."""
  sentences = []
  for paragraph in _PARAGRAPH_BREAK.split(text):
    flat = ' '.join(paragraph.split())
    sentences += [s for s in _SENTENCE_END.split(flat) if s]
  return sentences


def docstrings(data: bytes) -> list[tuple[str, str]]:
  """`(qualifier, docstring)` of the module, class and function docstrings of Python source
  bytes, in source order (none if unparsable); the module's qualifier is ''."""
  try:
    tree = ast.parse(data)
  except (SyntaxError, ValueError):
    return []
  found = []
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  for node in ast.walk(tree):
    if isinstance(node, kinds):
      text = ast.get_docstring(node, clean=True)
      if text:
        found.append((getattr(node, 'name', ''), getattr(node, 'lineno', 0), text))
  found.sort(key=lambda item: item[1])
  return [(name, text) for name, _, text in found]


def _utf8(data: bytes) -> str | None:
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError:
    return None


@functools.lru_cache(maxsize=3)
def _stdlib_texts(split: str) -> tuple:
  return tuple((f'{d.name}:{name}' if name else d.name, text, '')
               for d in stdlib_corpus.load_documents(split) for name, text in docstrings(d.data))


def raw_texts(data, split: str) -> list[tuple[str, str, str]]:
  """`(name, text, summary)` of `data.corpus` ('' summary: take the first sentence)."""
  corpus = data.corpus
  if corpus == 'stdlib':
    return list(_stdlib_texts(split))
  if text_files_corpus.is_text_files_corpus(corpus):
    texts = []
    for document in text_files_corpus.load_documents(corpus, split):
      text = _utf8(document.data)
      if text is not None:
        texts.append((document.name, text, ''))
    return texts
  if corpus == 'cnn_dailymail':
    if split not in TFDS_SPLITS:
      raise ConfigError('eval.split', f'unknown split {split!r}; expected one of {list(TFDS_SPLITS)}')
    builder = tfds_corpus._prepared_builder(  # pylint: disable=protected-access
        'cnn_dailymail', data.tfds_data_dir, data.tfds_cache_dir)
    examples = tfds_corpus._iterate_examples(builder, TFDS_SPLITS[split])  # pylint: disable=protected-access
    return [(f'cnn_dailymail/{split}/{i}', _text(e['article']), _text(e['highlights']))
            for i, e in enumerate(examples)]
  raise ConfigError('data.corpus', f'{corpus!r} is not a HIBERT corpus; use stdlib, '
                    'cnn_dailymail or a path to text files')


def _text(value) -> str:
  return value.decode('utf-8', errors='replace') if isinstance(value, bytes) else str(value)


def documents_of_texts(texts, with_summary: bool) -> tuple[list[SentenceDocument], int]:
  """`(documents, skipped)`: texts with fewer than `MIN_SENTENCES` sentences are skipped.

  With `with_summary`, a text without its own summary gives up its first
  sentence as the summary.
  """
  documents, skipped = [], 0
  for name, text, summary in texts:
    sentences = split_sentences(text)
    if with_summary and not summary and sentences:
      summary, sentences = sentences[0], sentences[1:]
    if len(sentences) < MIN_SENTENCES or (with_summary and not summary.strip()):
      skipped += 1
      continue
    documents.append(SentenceDocument(name, tuple(sentences), ' '.join(summary.split())))
  return documents, skipped


def load_documents(data, split: str, with_summary: bool, max_examples: int = 0) -> list:
  """The usable `SentenceDocument`s of `split` (the first `max_examples` if > 0)."""
  documents, skipped = documents_of_texts(raw_texts(data, split), with_summary)
  if skipped:
    logging.info('HIBERT data: skipped %d %s documents of %s with fewer than %d sentences',
                 skipped, split, data.corpus, MIN_SENTENCES)
  if not documents:
    raise ConfigError('data.corpus', f'the {split} split of {data.corpus!r} has no document '
                      f'with {MIN_SENTENCES} or more sentences ({skipped} skipped)')
  return documents[:max_examples] if max_examples else documents


def sentence_arrays(documents, tokenizer, max_sentences: int, max_sentence_tokens: int) -> dict:
  """`sentences`, `targets` int32 `[n, S, T]`; `sentence_mask` bool `[n, S]`;
  `example_index` int32 `[n]`; `weight` float32 `[n]` (S, T = max_sentences, max_sentence_tokens)."""
  n, S, T = len(documents), max_sentences, max_sentence_tokens
  sentences = np.full((n, S, T), tokenizer.pad_id, np.int32)
  targets = np.full((n, S, T), tokenizer.pad_id, np.int32)
  for row, document in enumerate(documents):
    for s, text in enumerate(document.sentences[:S]):
      tokens = tokenizer.encode(text)[:T - 1]
      sentences[row, s, :tokens.size + 1] = np.concatenate([[tokenizer.bos_id], tokens])
      targets[row, s, :tokens.size + 1] = np.concatenate([tokens, [tokenizer.eos_id]])
  return dict(sentences=sentences, targets=targets,
              sentence_mask=sentences[:, :, 0] == tokenizer.bos_id,
              example_index=np.arange(n, dtype=np.int32), weight=np.ones((n,), np.float32))

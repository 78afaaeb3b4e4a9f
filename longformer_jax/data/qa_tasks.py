"""Extractive QA data: examples, the built-in tasks, and fixed-size arrays.

An example is `[CLS] + question + [SEP] + context` (BOS serves as [CLS], EOS as
[SEP]), cut to `data.seq_len`; the answer is a span of context tokens.
[CLS], the question and [SEP] are global tokens (Longformer, sec. 6.1: global
attention on the question for QA). A text is given as the context split
around the answer (`before`, `answer`, `after`), each piece tokenized on its
own, so the answer's token span is exact for any tokenizer. Examples whose
answer does not fit in `data.seq_len` are dropped.

Sources (`data.corpus`):
  * `stdlib` (built in): for every function with a docstring in the standard
    library's sources, the question is the docstring's first line (at most
    `data.question_len` bytes) and the answer is the function's name in an
    excerpt of the file around its `def` (where it starts is a hash of the
    file and name).
  * `synthetic`: random lowercase letters with two planted uppercase words;
    the question is one of them, the answer its place. For tests.
  * `trivia_qa` (tensorflow-datasets, `rc` config by default, prepared under
    `data.tfds_data_dir`): the question, and an excerpt of its first evidence
    page around the first occurrence of an answer alias.
"""

import ast
import dataclasses
import re

import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import stdlib_corpus
from longformer_jax.data import tfds_tasks
from longformer_jax.data.task_text import QAText, excerpt_around, stable_hash

CORPORA = ('stdlib', 'synthetic', 'trivia_qa')


def docstring_questions(data: bytes, context_len: int, question_len: int,
                        salt: bytes) -> list[QAText]:
  """The built-in QA texts of one source file (none if it does not parse)."""
  try:
    tree = ast.parse(data)
  except (SyntaxError, ValueError):
    return []
  line_starts = np.cumsum([0] + [len(line) for line in data.splitlines(keepends=True)])
  texts = []
  for node in ast.walk(tree):
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    doc = ast.get_docstring(node)
    lines = [line.strip() for line in (doc or '').splitlines() if line.strip()]
    if not lines or len(lines[0]) < 8:
      continue
    line_begin = int(line_starts[node.lineno - 1])
    match = re.compile(rb'def\s+(' + re.escape(node.name.encode()) + rb')\b').search(
        data, line_begin)
    if match is None:
      continue
    text = excerpt_around(data, match.start(1), match.end(1), context_len,
                          salt + node.name.encode() + str(node.lineno).encode())
    texts.append(dataclasses.replace(text, question=lines[0].encode()[:question_len]))
  return texts


def stdlib_docstring_texts(split: str, context_len: int, question_len: int) -> list[QAText]:
  texts = []
  for document in stdlib_corpus.load_documents(split):
    texts += docstring_questions(document.data, context_len, question_len,
                                 document.name.encode())
  texts.sort(key=lambda t: stable_hash(t.question + t.before + t.answer))
  return texts


def synthetic_texts(count: int, context_len: int, seed: int) -> list[QAText]:
  """Two distinct uppercase 3-letter words in random lowercase text; ask for one of them."""
  rng = np.random.default_rng(seed)
  texts = []
  for _ in range(count):
    letters = rng.integers(ord('a'), ord('z') + 1, context_len).astype(np.uint8)
    first, second = sorted(rng.choice(context_len // 3, 2, replace=False) * 3)
    words = rng.integers(ord('A'), ord('Z') + 1, (2, 3)).astype(np.uint8)
    words[1, 0] = ord('A') + (words[0, 0] - ord('A') + 1) % 26   # the two words differ
    letters[first:first + 3], letters[second:second + 3] = words[0], words[1]
    begin = (first, second)[int(rng.integers(0, 2))]
    data = letters.tobytes()
    texts.append(QAText(data[begin:begin + 3], data[:begin], data[begin:begin + 3],
                        data[begin + 3:]))
  return texts


def load_texts(data: ml_collections.ConfigDict, split: str, seed: int) -> list[QAText]:
  context_len = data.seq_len - data.question_len - 2
  if data.corpus == 'stdlib':
    return stdlib_docstring_texts(split, context_len, data.question_len)
  if data.corpus == 'synthetic':
    return synthetic_texts(data.max_examples or 1024, context_len, seed + (split == 'valid'))
  if data.corpus == 'trivia_qa':
    return tfds_tasks.trivia_qa(split, data.tfds_data_dir, context_len,
                                data.tfds_config or 'rc', cache_dir=data.tfds_cache_dir)
  raise ConfigError('data.corpus', f'unknown QA corpus {data.corpus!r}; expected one of {CORPORA}')


def qa_arrays(texts: list[QAText], tokenizer, seq_len: int, question_len: int) -> dict:
  """Fixed-size arrays: `inputs`, `input_mask`, `global_flags`, `answer_mask` `[n, seq_len]`;
  `answer_start`, `answer_end` (inclusive token indices into `inputs`), `weight` `[n]`."""
  rows = []
  for text in texts:
    question = (tokenizer.encode(text.question)[:question_len] if text.question
                else np.zeros(0, np.int32))
    before, answer, after = (tokenizer.encode(piece) if piece else np.zeros(0, np.int32)
                             for piece in (text.before, text.answer, text.after))
    offset = 2 + question.size
    start = offset + before.size
    end = start + answer.size - 1
    if answer.size == 0 or end >= seq_len:
      continue
    tokens = np.concatenate([[tokenizer.bos_id], question, [tokenizer.eos_id], before, answer,
                             after])[:seq_len]
    rows.append((tokens, offset, start, end))
  n = len(rows)
  inputs = np.full((n, seq_len), tokenizer.pad_id, np.int32)
  global_flags = np.zeros((n, seq_len), bool)
  answer_mask = np.zeros((n, seq_len), bool)
  for row, (tokens, offset, _, _) in enumerate(rows):
    inputs[row, :tokens.size] = tokens
    global_flags[row, :offset] = True
    answer_mask[row, offset:tokens.size] = True
  return dict(inputs=inputs, input_mask=inputs != tokenizer.pad_id, global_flags=global_flags,
              answer_mask=answer_mask,
              answer_start=np.array([r[2] for r in rows], np.int32).reshape(n),
              answer_end=np.array([r[3] for r in rows], np.int32).reshape(n),
              weight=np.ones((n,), np.float32))


def load_arrays(config: ml_collections.ConfigDict, split: str, tokenizer) -> dict:
  data = config.data
  texts = load_texts(data, split, config.seed)
  if data.max_examples:
    texts = texts[:data.max_examples]
  return qa_arrays(texts, tokenizer, data.seq_len, data.question_len)

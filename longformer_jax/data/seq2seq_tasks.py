"""Sequence-to-sequence (summarisation) data for LED: examples, built-in tasks, arrays.

The source is `[BOS] + source`, cut to `data.seq_len`, with global attention
on its first token (as LED does on `<s>`). The target is `target + [EOS]`,
cut to `data.target_len`; the decoder reads it shifted right behind a BOS
(teacher forcing).

Sources (`data.corpus`):
  * `stdlib` (built in): the first `data.seq_len - 1` bytes of a standard
    library source file (less a character the cut splits) -> the names of its top-level functions and classes
    that start in that excerpt, in order, separated by spaces.
  * `synthetic`: random lowercase letters with one planted uppercase letter
    -> that letter (found only through cross-attention). For tests.
  * `scrolls` (tensorflow-datasets `scrolls/<data.tfds_config>`, default
    `gov_report`, prepared under `data.tfds_data_dir`): input -> output.
"""

import ast

import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import stdlib_corpus, tfds_tasks
from longformer_jax.data.task_text import whole_characters

CORPORA = ('stdlib', 'synthetic', 'scrolls')


def top_level_names(data: bytes, excerpt_len: int) -> list[str]:
  """Names of the module's top-level defs and classes whose statement starts in `data[:excerpt_len]`."""
  try:
    tree = ast.parse(data)
  except (SyntaxError, ValueError):
    return []
  line_starts = np.cumsum([0] + [len(line) for line in data.splitlines(keepends=True)])
  definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
  return [node.name for node in tree.body
          if isinstance(node, definitions) and line_starts[node.lineno - 1] < excerpt_len]


def stdlib_names_texts(split: str, source_len: int) -> list[tuple[bytes, bytes]]:
  pairs = []
  for document in stdlib_corpus.load_documents(split):
    names = top_level_names(document.data, source_len)
    if names:
      pairs.append((document.data[:source_len], ' '.join(names).encode()))
  return pairs


def synthetic_texts(count: int, source_len: int, seed: int) -> list[tuple[bytes, bytes]]:
  """Random lowercase letters with one planted uppercase letter -> that letter."""
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    letters = rng.integers(ord('a'), ord('z') + 1, source_len).astype(np.uint8)
    letter = rng.integers(ord('A'), ord('Z') + 1)
    letters[rng.integers(0, source_len)] = letter
    pairs.append((letters.tobytes(), bytes([letter])))
  return pairs


def load_texts(data: ml_collections.ConfigDict, split: str, seed: int) -> list[tuple[bytes, bytes]]:
  source_len = data.seq_len - 1
  if data.corpus == 'stdlib':
    return stdlib_names_texts(split, source_len)
  if data.corpus == 'synthetic':
    return synthetic_texts(data.max_examples or 1024, source_len, seed + (split == 'valid'))
  if data.corpus == 'scrolls':
    return tfds_tasks.scrolls(split, data.tfds_data_dir, data.tfds_config or 'gov_report',
                              cache_dir=data.tfds_cache_dir)
  raise ConfigError('data.corpus', f'unknown seq2seq corpus {data.corpus!r}; '
                    f'expected one of {CORPORA}')


def seq2seq_arrays(pairs: list[tuple[np.ndarray, np.ndarray]], seq_len: int, target_len: int,
                   bos_id: int, eos_id: int, pad_id: int) -> dict:
  """Token pairs -> `inputs`, `input_mask`, `global_flags` `[n, seq_len]`; `decoder_inputs`,
  `decoder_targets`, `decoder_mask` `[n, target_len]`; `weight` `[n]`."""
  n = len(pairs)
  inputs = np.full((n, seq_len), pad_id, np.int32)
  decoder_inputs = np.full((n, target_len), pad_id, np.int32)
  decoder_targets = np.full((n, target_len), pad_id, np.int32)
  decoder_mask = np.zeros((n, target_len), bool)
  for row, (source, target) in enumerate(pairs):
    source = np.concatenate([[bos_id], source[:seq_len - 1]])
    inputs[row, :source.size] = source
    full = np.concatenate([target[:target_len - 1], [eos_id]])
    decoder_targets[row, :full.size] = full
    decoder_inputs[row, :full.size] = np.concatenate([[bos_id], full[:-1]])
    decoder_mask[row, :full.size] = True
  global_flags = np.zeros((n, seq_len), bool)
  global_flags[:, 0] = True
  return dict(inputs=inputs, input_mask=inputs != pad_id, global_flags=global_flags,
              decoder_inputs=decoder_inputs, decoder_targets=decoder_targets,
              decoder_mask=decoder_mask, weight=np.ones((n,), np.float32))


def load_arrays(config: ml_collections.ConfigDict, split: str, tokenizer) -> dict:
  data = config.data
  pairs = load_texts(data, split, config.seed)
  if data.max_examples:
    pairs = pairs[:data.max_examples]
  tokens = [(tokenizer.encode(whole_characters(source)) if source else np.zeros(0, np.int32),
             tokenizer.encode(whole_characters(target)) if target else np.zeros(0, np.int32))
            for source, target in pairs]
  return seq2seq_arrays(tokens, data.seq_len, data.target_len, tokenizer.bos_id,
                        tokenizer.eos_id, tokenizer.pad_id)

"""Sequence classification data: examples, the built-in tasks, and fixed-size arrays.

An example is `[CLS] + tokens` (the tokenizer's BOS serves as [CLS]), cut to
`data.seq_len` and padded; [CLS] is the one global token (Longformer, sec.
6.1) and the classifier reads its final state.

Sources (`data.corpus`):
  * `stdlib` (built in, no download): excerpts of the standard library's
    source files, `data.seq_len - 1` bytes each (consecutive, non-overlapping
    pieces of every file); label 1 iff the excerpt contains a top-level class
    statement (a line starting with `class `). Negatives are subsampled
    (deterministically) to the number of positives, so chance is 50%. A
    character the cut splits is dropped (`whole_characters`).
  * `synthetic`: random lowercase letters; label 1 iff the letter `z` occurs
    (exactly once, at a random place). For tests: tiny and learnable.
  * `imdb_reviews` (tensorflow-datasets, prepared under `data.tfds_data_dir`):
    review text, label 1 = positive; 'valid' reads tfds' test split.
  * The Long Range Arena's generated tasks (data/lra/, docs/lra.md), splits
    train | valid | test: `listops` (10 classes; tokenizer 'listops'),
    `pathfinder` (grey pixels as byte tokens, raster order) and `lra_text` (bytes).

With `data.cls_token=False` an example is its content alone, from position 0
(an image's raster stays aligned to the positions); with `data.cls_global=False`
no token is flagged global.
"""

import dataclasses
import re

import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError, require
from longformer_jax.data import stdlib_corpus, tfds_tasks
from longformer_jax.data.curriculum_streams import require_steps_after
from longformer_jax.data.lra import listops, pathfinder, text_classification
from longformer_jax.data.task_text import stable_hash, whole_characters

LRA_CORPORA = ('listops', 'pathfinder', 'lra_text')
CORPORA = ('stdlib', 'synthetic', 'imdb_reviews') + LRA_CORPORA
_TOP_LEVEL_CLASS = re.compile(rb'^class \w', re.MULTILINE)
# The data settings the tasks reading these examples (classification, masked_pretraining) read.
DATA_KEYS = ('seq_len', 'max_examples', 'tfds_config', 'cls_token', 'cls_global', 'listops',
             'pathfinder', 'lra_text')


def check_examples_fit(data) -> None:
  """`ConfigError` naming `data.seq_len` when it would cut a generated example short (a
  ListOps tree cut short has no value; a Pathfinder image must be whole)."""
  if data.corpus == 'listops':
    longest = data.listops.max_length - 1 + int(data.cls_token)
    require(data.seq_len >= longest, 'data.seq_len',
            f'{data.seq_len} cuts ListOps trees short: the longest has '
            f'{data.listops.max_length - 1} tokens (data.listops.max_length - 1), '
            f'{longest} with [CLS]')
  if data.corpus == 'pathfinder':
    pixels = data.pathfinder.resolution ** 2 + int(data.cls_token)
    require(data.seq_len >= pixels, 'data.seq_len',
            f'{data.seq_len} cuts Pathfinder images short: they have {pixels} tokens '
            f'(data.pathfinder.resolution ** 2{" + [CLS]" if data.cls_token else ""})')


@dataclasses.dataclass(frozen=True)
class ClassificationExample:
  tokens: np.ndarray   # int32 [n], without [CLS]
  label: int


def stdlib_has_class_texts(split: str, excerpt_len: int) -> list[tuple[bytes, int]]:
  """`(excerpt, label)` pairs of the built-in task, positives and negatives balanced."""
  positives, negatives = [], []
  for document in stdlib_corpus.load_documents(split):
    for begin in range(0, len(document.data), excerpt_len):
      excerpt = document.data[begin:begin + excerpt_len]
      label = int(bool(_TOP_LEVEL_CLASS.search(excerpt)))
      (positives if label else negatives).append((excerpt, label))
  negatives.sort(key=lambda pair: stable_hash(pair[0]))
  pairs = positives + negatives[:len(positives)]
  # Another hash for the order (the kept negatives have the smallest hashes of the first).
  pairs.sort(key=lambda pair: stable_hash(b'order:' + pair[0]))
  return pairs


def synthetic_texts(count: int, length: int, seed: int) -> list[tuple[bytes, int]]:
  """`count` random lowercase texts of `length` letters; label 1 iff one `z` was planted."""
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    letters = rng.integers(ord('a'), ord('z'), length).astype(np.uint8)   # never 'z'
    label = int(rng.integers(0, 2))
    if label:
      letters[rng.integers(0, length)] = ord('z')
    pairs.append((letters.tobytes(), label))
  return pairs


def load_texts(data: ml_collections.ConfigDict, split: str, seed: int) -> list[tuple[bytes, int]]:
  """The `(text, label)` pairs of `split` ('train' | 'valid') of `data.corpus`."""
  if data.corpus == 'stdlib':
    return stdlib_has_class_texts(split, data.seq_len - 1)
  if data.corpus == 'synthetic':
    count = data.max_examples or 1024
    return synthetic_texts(count, data.seq_len - 1, seed + (split == 'valid'))
  if data.corpus == 'imdb_reviews':
    return tfds_tasks.imdb_reviews(split, data.tfds_data_dir, data.tfds_cache_dir)
  raise ConfigError('data.corpus', f'unknown classification corpus {data.corpus!r}; '
                    f'expected one of {CORPORA}')


def example_arrays(token_lists: list[np.ndarray], seq_len: int, cls_id: int, pad_id: int,
                   cls_token: bool = True, cls_global: bool = True) -> dict[str, np.ndarray]:
  """`inputs`, `input_mask`, `global_flags` `[n, seq_len]`: `[CLS] + tokens` (or the tokens
  alone without `cls_token`) cut to `seq_len` and padded; [CLS] flagged global if `cls_global`."""
  n = len(token_lists)
  inputs = np.full((n, seq_len), pad_id, np.int32)
  input_mask = np.zeros((n, seq_len), bool)
  for row, tokens in enumerate(token_lists):
    tokens = np.concatenate([[cls_id], tokens])[:seq_len] if cls_token else tokens[:seq_len]
    inputs[row, :tokens.size] = tokens
    input_mask[row, :tokens.size] = True
  global_flags = np.zeros((n, seq_len), bool)
  global_flags[:, 0] = cls_token and cls_global
  return dict(inputs=inputs, input_mask=input_mask, global_flags=global_flags)


def classification_arrays(examples: list[ClassificationExample], seq_len: int, cls_id: int,
                          pad_id: int, cls_token: bool = True,
                          cls_global: bool = True) -> dict[str, np.ndarray]:
  """Fixed-size arrays: `inputs`, `input_mask`, `global_flags` `[n, seq_len]`; `label`, `weight` `[n]`."""
  arrays = example_arrays([e.tokens for e in examples], seq_len, cls_id, pad_id, cls_token,
                          cls_global)
  return dict(arrays, label=np.array([e.label for e in examples], np.int32),
              weight=np.ones((len(examples),), np.float32))


def split_count(size: int, max_examples: int) -> int:
  """Examples to generate of a split of `size`: at most `data.max_examples` (0: all)."""
  return min(size, max_examples) if max_examples else size


def lra_examples(data: ml_collections.ConfigDict, split: str,
                 tokenizer) -> list[ClassificationExample]:
  """The examples of `split` of a generated LRA corpus (data/lra/), tokenized."""
  if data.corpus == 'listops':
    section = listops.ListOpsConfig.build(data.listops, 'data.listops')
    trees = listops.listops_split(section, split, split_count(section.split_size(split),
                                                              data.max_examples))
    return [ClassificationExample(tokenizer.encode(tree.text), tree.label) for tree in trees]
  if data.corpus == 'pathfinder':
    section = pathfinder.PathfinderConfig.build(data.pathfinder, 'data.pathfinder')
    return pathfinder_examples(section, split, data.max_examples, tokenizer)
  section = text_classification.TextConfig.build(data.lra_text, 'data.lra_text')
  documents = text_classification.text_split(
      section, split, split_count(section.split_size(split), data.max_examples))
  return [ClassificationExample(tokenizer.encode(doc.data), doc.label) for doc in documents]


def pathfinder_examples(section: pathfinder.PathfinderConfig, split: str, max_examples: int,
                        tokenizer) -> list[ClassificationExample]:
  """The images of `split` (at most `max_examples`; 0: all) as byte tokens in raster order:
  pixel (row, column) is token row * resolution + column."""
  images = pathfinder.pathfinder_split(section, split, split_count(section.split_size(split),
                                                                   max_examples))
  return [ClassificationExample(tokenizer.encode(image.tobytes()), int(label))
          for image, label in zip(images.images, images.labels)]


def load_arrays(config: ml_collections.ConfigDict, split: str, tokenizer) -> dict[str, np.ndarray]:
  """The arrays of `split` for `config` (its `data` section), at most `data.max_examples`."""
  data = config.data
  if data.corpus in LRA_CORPORA:
    examples = lra_examples(data, split, tokenizer)
  else:
    texts = load_texts(data, split, config.seed)
    if data.max_examples:
      texts = texts[:data.max_examples]
    examples = [ClassificationExample(tokenizer.encode(whole_characters(text))[:data.seq_len - 1],
                                      label) for text, label in texts]
  return classification_arrays(examples, data.seq_len, tokenizer.bos_id, tokenizer.pad_id,
                               data.cls_token, data.cls_global)


def load_curriculum_arrays(config: ml_collections.ConfigDict, tokenizer
                           ) -> tuple[dict[str, np.ndarray], int] | None:
  """The training arrays of Pathfinder's path-length curriculum (`curriculum_dashes` dashes
  per path, the images of the same size) and its steps, `data.pathfinder.curriculum_steps`;
  None for every other corpus and when it is off.

  Raises:
    ConfigError: the curriculum leaves no step of `train.num_steps` for the task's paths.
  """
  data = config.data
  if data.corpus != 'pathfinder':
    return None
  section = pathfinder.PathfinderConfig.build(data.pathfinder, 'data.pathfinder')
  if not section.curriculum_steps:
    return None
  require_steps_after('data.pathfinder.curriculum_steps', section.curriculum_steps,
                      config.train.num_steps, 'train.num_steps',
                      f'the paths of dashes_per_path={section.dashes_per_path}')
  examples = pathfinder_examples(pathfinder.curriculum_config(section), 'train',
                                 data.max_examples, tokenizer)
  return (classification_arrays(examples, data.seq_len, tokenizer.bos_id, tokenizer.pad_id,
                                data.cls_token, data.cls_global), section.curriculum_steps)

"""LRA's Text task, rebuilt from the standard library: do both halves come from the same kind of file?

LRA's Text task is byte-level IMDb sentiment (Tay et al., 2020, sec. 3.2), a
document-level label whose evidence is spread through the review. IMDb cannot
be downloaded here, so this task builds documents from text every machine has
(data/lra/python_sources.py) in a way that no part of a document decides its
label alone:

  document = excerpt X of file A + excerpt Y of file B      (A != B, cut at a line start)
  label    = 1 if A and B are of the same group (both test modules or both
             library modules), else 0

The length is drawn uniformly in [`min_bytes`, `max_bytes`] (LRA's 1K-4K
bytes), the cut uniformly among the line starts of the middle third that
leave X at least `min_first_bytes` (256) long, the two groups of X uniformly,
and the label by a fair coin, all independently. So:

  * the first bytes (everything before the cut: at least a third of the
    document and at least 256 bytes) come from X alone, whose group is
    independent of the label; a reader of any prefix shorter than the cut
    is at chance;
  * the length is independent of the label;
  * every document is a splice of two files, so a discontinuity is no clue;
  * what decides the label is the relation of the kind of code before the cut
    to the kind after it, each part's kind spread over its hundreds of bytes.

Example i of a split depends only on (`seed`, split, i), so every model seed
sees the same data and the same test set.
"""

import dataclasses

import numpy as np

from longformer_jax.config.section import Section
from longformer_jax.data.lra import python_sources

SPLITS = ('train', 'valid', 'test')
NUM_CLASSES = 2


@dataclasses.dataclass(frozen=True)
class TextConfig(Section):
  """`data.lra_text`: document lengths and split sizes (LRA's Text shapes by default)."""
  min_bytes: int = 1024
  max_bytes: int = 4096
  min_first_bytes: int = 256         # the cut leaves excerpt X at least this long
  train_examples: int = 25_000       # IMDb's training set size, as LRA's Text
  valid_examples: int = 2_000
  test_examples: int = 2_000
  seed: int = 0                      # the data's own seed (model seeds share the data)

  def validate(self, env) -> None:
    del env
    self.require(self.min_bytes >= 48, 'min_bytes', 'must be >= 48 (two excerpts of lines)')
    self.require(self.max_bytes >= self.min_bytes, 'max_bytes', 'must be >= min_bytes')
    self.require(0 <= self.min_first_bytes < 2 * self.min_bytes // 3 - 16, 'min_first_bytes',
                 f'must be >= 0 and leave room before two thirds of the shortest document '
                 f'(min_bytes={self.min_bytes})')
    for name in ('train_examples', 'valid_examples', 'test_examples'):
      self.require(getattr(self, name) >= 0, name, 'must be >= 0')

  def split_size(self, split: str) -> int:
    return getattr(self, f'{split}_examples')


@dataclasses.dataclass(frozen=True)
class TextExample:
  data: bytes                        # the document, min_bytes..max_bytes bytes
  label: int                         # 1: both excerpts from the same group
  cut: int                           # where excerpt Y starts
  groups: tuple[str, str]            # the groups of X and Y
  files: tuple[str, str]             # their files (paths relative to the stdlib folder)


def example(config: TextConfig, split: str, index: int) -> TextExample:
  """Example `index` of `split` (see the module docstring)."""
  if split not in SPLITS:
    raise ValueError(f'unknown Text split {split!r}; expected one of {SPLITS}')
  rng = np.random.default_rng([config.seed, SPLITS.index(split), index, 0x7e47])
  length = int(rng.integers(config.min_bytes, config.max_bytes + 1))
  label = int(rng.integers(2))
  first_group = python_sources.GROUPS[int(rng.integers(2))]
  second_group = first_group if label else next(g for g in python_sources.GROUPS
                                                if g != first_group)
  first_files = python_sources.source_files(split, first_group, config.max_bytes)
  second_files = python_sources.source_files(split, second_group, config.max_bytes)
  first_index, first = python_sources.excerpt(rng, first_files, length)
  # The cut: a line start of X in the middle third of the document, past min_first_bytes.
  low = max(length // 3, config.min_first_bytes)
  starts = python_sources.line_starts(first)
  middle = starts[(starts >= low) & (starts <= 2 * length // 3)]
  cut = int(middle[rng.integers(middle.size)]) if middle.size else (low + 2 * length // 3) // 2
  exclude = first_index if second_group == first_group else -1
  second_index, second = python_sources.excerpt(rng, second_files, length - cut, exclude)
  return TextExample(first[:cut] + second, label, cut, (first_group, second_group),
                     (first_files.paths[first_index], second_files.paths[second_index]))


def text_split(config: TextConfig, split: str, count: int | None = None) -> list[TextExample]:
  """The first `count` (default: the split's size) examples of `split`."""
  count = config.split_size(split) if count is None else count
  return [example(config, split, index) for index in range(count)]

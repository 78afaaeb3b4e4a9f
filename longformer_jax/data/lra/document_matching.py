"""LRA's Retrieval task, rebuilt from the standard library: do two documents cite the same module?

LRA's Retrieval task is byte-level matching on the ACL Anthology Network (Tay
et al., 2020, sec. 3.3): given two papers, does one cite the other? Each
document is encoded alone (two towers, one encoder) and the pair is
classified from the two vectors. AAN cannot be downloaded here; this task
keeps the form (two byte-level documents, a citation link decides the
label) over text every machine has (data/lra/python_sources.py):

  document = an excerpt of a standard-library file (either group) with one line
             `# See also: NAME` inserted at a line start drawn uniformly
  label    = 1 if both documents cite the same NAME, else 0

NAME is one of `num_links` module names of the standard library (drawn once
from the sorted module list with the data seed). Each document's length is
drawn uniformly in [`min_bytes`, `max_bytes`], its file and its link line's
place independently of the other's and of the label. So a reader of the first
256 bytes of each document sees both links only when both fall there, the
lengths say nothing, and the excerpts' own content is independent of the
label: only the two citations, somewhere in each document, decide it.

Example i of a split depends only on (`seed`, split, i).
"""

import dataclasses
import functools
import pathlib

import numpy as np

from longformer_jax.config.section import Section
from longformer_jax.data import stdlib_corpus
from longformer_jax.data.lra import python_sources

SPLITS = ('train', 'valid', 'test')
NUM_CLASSES = 2
LINK_PREFIX = b'# See also: '


@dataclasses.dataclass(frozen=True)
class RetrievalConfig(Section):
  """`data.lra_retrieval`: document lengths, the link names and split sizes."""
  min_bytes: int = 1024
  max_bytes: int = 4096              # LRA: up to 4K bytes per document
  num_links: int = 32                # module names a document may cite
  train_examples: int = 147_086      # AAN's training pairs, as LRA's Retrieval
  valid_examples: int = 2_000
  test_examples: int = 2_000
  seed: int = 0                      # the data's own seed (model seeds share the data)
  # Length curriculum (data/curriculum_streams.py): the first N training steps read
  # the same pairs with documents of curriculum_min_bytes to curriculum_max_bytes, padded to
  # data.seq_len like the rest. 0: off.
  curriculum_steps: int = 0
  curriculum_min_bytes: int = 64
  curriculum_max_bytes: int = 127

  def validate(self, env) -> None:
    del env
    self.require(self.min_bytes >= 64, 'min_bytes', 'must be >= 64 (an excerpt and a link)')
    self.require(self.max_bytes >= self.min_bytes, 'max_bytes', 'must be >= min_bytes')
    self.require(self.curriculum_steps >= 0, 'curriculum_steps', 'must be >= 0 (0: off)')
    self.require(64 <= self.curriculum_min_bytes <= self.curriculum_max_bytes,
                 'curriculum_min_bytes', 'must be >= 64 and <= curriculum_max_bytes')
    if self.curriculum_steps:
      self.require(self.curriculum_max_bytes <= self.max_bytes, 'curriculum_max_bytes',
                   f'must be <= max_bytes ({self.max_bytes}): the curriculum reads shorter '
                   f'documents first')
    self.require(self.num_links >= 2, 'num_links', 'must be >= 2 (a negative cites another)')
    for name in ('train_examples', 'valid_examples', 'test_examples'):
      self.require(getattr(self, name) >= 0, name, 'must be >= 0')

  def split_size(self, split: str) -> int:
    return getattr(self, f'{split}_examples')


@dataclasses.dataclass(frozen=True)
class RetrievalExample:
  first: bytes
  second: bytes
  label: int                         # 1: the same link
  links: tuple[str, str]             # the names each document cites
  link_offsets: tuple[int, int]      # where each link line starts


@functools.lru_cache(maxsize=None)
def link_names(num_links: int, seed: int) -> tuple[str, ...]:
  """`num_links` distinct dotted module names of the standard library, drawn with `seed`."""
  names = sorted({str(pathlib.PurePosixPath(path).with_suffix('')).replace('/', '.')
                  .removesuffix('.__init__') for path in stdlib_corpus.list_all_sources()
                  if python_sources.group_of(path) == 'library'})
  if len(names) < num_links:
    raise python_sources.MissingSourcesError(
        f'data.lra_retrieval.num_links: {num_links} is more than the {len(names)} library '
        f'modules of the standard library at {stdlib_corpus.stdlib_root()}')
  chosen = np.random.default_rng([seed, 0x11c5]).choice(len(names), num_links, replace=False)
  return tuple(names[i] for i in sorted(chosen))


def cited_document(rng: np.random.Generator, files: list, config: RetrievalConfig,
                   name: str) -> tuple[bytes, int]:
  """`(document, offset of its link line)`: an excerpt with `# See also: name` inserted."""
  line = LINK_PREFIX + name.encode() + b'\n'
  length = int(rng.integers(config.min_bytes, config.max_bytes + 1))
  group = files[int(rng.integers(len(files)))]
  text = LINK_PREFIX
  while LINK_PREFIX in text:     # an excerpt never cites anything of its own
    _, text = python_sources.excerpt(rng, group, length - len(line))
  starts = python_sources.line_starts(text)
  offset = int(starts[rng.integers(starts.size)])
  return text[:offset] + line + text[offset:], offset


def example(config: RetrievalConfig, split: str, index: int) -> RetrievalExample:
  """Example `index` of `split` (see the module docstring)."""
  if split not in SPLITS:
    raise ValueError(f'unknown Retrieval split {split!r}; expected one of {SPLITS}')
  names = link_names(config.num_links, config.seed)
  files = [python_sources.source_files(split, group, config.max_bytes)
           for group in python_sources.GROUPS]
  rng = np.random.default_rng([config.seed, SPLITS.index(split), index, 0x4e7])
  label = int(rng.integers(2))
  first_link = int(rng.integers(len(names)))
  second_link = first_link if label else (
      first_link + 1 + int(rng.integers(len(names) - 1))) % len(names)
  first, first_offset = cited_document(rng, files, config, names[first_link])
  second, second_offset = cited_document(rng, files, config, names[second_link])
  return RetrievalExample(first, second, label, (names[first_link], names[second_link]),
                          (first_offset, second_offset))


def curriculum_config(config: RetrievalConfig) -> RetrievalConfig:
  """The settings of the curriculum's first stage: pairs of the same labels and links,
  documents of `curriculum_min_bytes` to `curriculum_max_bytes`."""
  return dataclasses.replace(config, min_bytes=config.curriculum_min_bytes,
                             max_bytes=config.curriculum_max_bytes, curriculum_steps=0)


def retrieval_split(config: RetrievalConfig, split: str,
                    count: int | None = None) -> list[RetrievalExample]:
  """The first `count` (default: the split's size) examples of `split`."""
  count = config.split_size(split) if count is None else count
  return [example(config, split, index) for index in range(count)]

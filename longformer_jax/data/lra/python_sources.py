"""The byte-level LRA tasks' text: the standard library's source files, in two groups and three splits.

Text and Retrieval (data/lra/text_classification.py, data/lra/document_matching.py)
replace LRA's IMDb and AAN, which cannot be downloaded here, with excerpts of
the files every Python installation has: the `.py` files under
`sysconfig.get_paths()['stdlib']` (third-party packages excluded, as in
data/stdlib_corpus.py). Two groups:

  test      test modules: a file named `test_*.py` or `*_test.py`, or any file under a
            folder named `test`, `tests` or `idle_test`
  library   every other module

The tasks' own file split (not the LM corpus's, whose test split is 2% of the
files): a stable hash of the relative path puts 80% of the files in train, 10%
in valid and 10% in test, so no example of one split quotes a file of another.
"""

import dataclasses
import functools
import hashlib
import pathlib

import numpy as np

from longformer_jax.data import stdlib_corpus

GROUPS = ('test', 'library')
TEST_FOLDERS = frozenset({'test', 'tests', 'idle_test'})
SPLIT_BUCKETS = {'train': range(0, 80), 'valid': range(80, 90), 'test': range(90, 100)}


class MissingSourcesError(Exception):
  """The installation lacks a group or split the tasks need (one line, names the folder)."""


def group_of(relative_path: str) -> str:
  """'test' or 'library' for a path relative to the standard library folder."""
  parts = pathlib.PurePosixPath(relative_path).parts
  name = parts[-1]
  if name.startswith('test_') or name.endswith('_test.py') or TEST_FOLDERS & set(parts[:-1]):
    return 'test'
  return 'library'


def split_of(relative_path: str) -> str:
  """The tasks' split of a file: 80 / 10 / 10 by a stable hash of its path."""
  bucket = int.from_bytes(hashlib.sha256(b'lra/' + relative_path.encode()).digest()[:8],
                          'big') % 100
  return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


@dataclasses.dataclass(frozen=True)
class SourceFiles:
  """The files of one (split, group): their paths and contents, and their sizes for sampling."""
  paths: tuple[str, ...]
  contents: tuple[bytes, ...]

  @functools.cached_property
  def probabilities(self) -> np.ndarray:
    """`[files]`: each file's share of the bytes (files are drawn by size)."""
    sizes = np.array([len(data) for data in self.contents], np.float64)
    return sizes / sizes.sum()

  @functools.cached_property
  def line_starts(self) -> tuple[np.ndarray, ...]:
    """Each file's `line_starts`."""
    return tuple(line_starts(data) for data in self.contents)


@functools.lru_cache(maxsize=None)
def source_files(split: str, group: str, min_bytes: int) -> SourceFiles:
  """The files of `split` and `group` of at least `min_bytes` bytes, sorted by path."""
  root = stdlib_corpus.stdlib_root()
  paths = [path for path in stdlib_corpus.list_all_sources()
           if split_of(path) == split and group_of(path) == group]
  contents = [(root / path).read_bytes() for path in paths]
  kept = [(path, data) for path, data in zip(paths, contents) if len(data) >= min_bytes]
  if len(kept) < 2:
    raise MissingSourcesError(
        f'the standard library at {root} has {len(kept)} {group} files of at least {min_bytes} '
        f'bytes in the {split} split; the byte-level LRA tasks need several (an installation '
        f'without its test modules cannot build them)')
  return SourceFiles(tuple(p for p, _ in kept), tuple(d for _, d in kept))


def line_starts(data: bytes) -> np.ndarray:
  """Offsets at which a line of `data` starts (0 included), int64 `[lines]`."""
  newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == ord('\n'))
  return np.concatenate([[0], newlines + 1]).astype(np.int64)


def excerpt(rng: np.random.Generator, files: SourceFiles, length: int,
            exclude: int = -1) -> tuple[int, bytes]:
  """`(file index, length bytes)`: an excerpt of a file (not `exclude`) that starts at a line
  start drawn uniformly among those leaving `length` bytes; files are drawn by size, so every
  byte of the group is about as likely."""
  cumulative = np.cumsum(files.probabilities)
  while True:
    index = min(int(np.searchsorted(cumulative, rng.random(), side='right')),
                len(cumulative) - 1)
    if index == exclude:
      continue
    data = files.contents[index]
    starts = files.line_starts[index]
    starts = starts[:np.searchsorted(starts, len(data) - length, side='right')]
    if starts.size:
      begin = int(starts[rng.integers(starts.size)])
      return index, data[begin:begin + length]

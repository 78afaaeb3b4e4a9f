"""The built-in corpus: the running interpreter's standard library sources.

Every Python installation has it, so training works with no download. One
document per `.py` file under `sysconfig.get_paths()['stdlib']`, read as raw
bytes (a few test files are deliberately not UTF-8), excluding third-party
packages (anything under `site-packages` or `dist-packages`). Empty files
(mostly `__init__.py`) are skipped when listing: they hold no tokens.

Documents are ordered by relative POSIX path. The split of a file depends on
its relative path only (a stable hash, not Python's salted `hash`), so it is
the same on every machine with the same Python version:

  bucket = int.from_bytes(sha256(path)[:8], 'big') % 100
  test: buckets 0-1, valid: buckets 2-3, train: buckets 4-99.
"""

import functools
import hashlib
import os
import pathlib
import sysconfig

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.document import Document

SPLITS = ('train', 'valid', 'test')
EXCLUDED_FOLDERS = frozenset({'site-packages', 'dist-packages'})
NUM_BUCKETS = 100
TEST_BUCKETS = range(0, 2)
VALID_BUCKETS = range(2, 4)


def stdlib_root() -> pathlib.Path:
  """The folder of the running interpreter's standard library."""
  return pathlib.Path(sysconfig.get_paths()['stdlib'])


def split_of(relative_path: str) -> str:
  """The split ('train' | 'valid' | 'test') of a relative POSIX path.

  Also splits the user's text files (`text_files_corpus`).
  """
  digest = hashlib.sha256(relative_path.encode('utf-8')).digest()
  bucket = int.from_bytes(digest[:8], 'big') % NUM_BUCKETS
  if bucket in TEST_BUCKETS:
    return 'test'
  if bucket in VALID_BUCKETS:
    return 'valid'
  return 'train'


@functools.lru_cache(maxsize=1)
def _all_nonempty_sources() -> tuple[str, ...]:
  """Relative POSIX paths of all non-empty stdlib `.py` files, sorted."""
  root = stdlib_root()
  paths = []
  for folder, subfolders, files in os.walk(root):
    subfolders[:] = [d for d in subfolders if d not in EXCLUDED_FOLDERS]
    for file_name in files:
      path = pathlib.Path(folder) / file_name
      if file_name.endswith('.py') and path.is_file() and path.stat().st_size:
        paths.append(path.relative_to(root).as_posix())
  return tuple(sorted(paths))


def list_all_sources() -> tuple[str, ...]:
  """Relative POSIX paths of every non-empty stdlib `.py` file, sorted (all splits)."""
  return _all_nonempty_sources()


def check_split(split: str, corpus: str = 'stdlib') -> None:
  """Raises `ConfigError` unless `split` is one of `SPLITS` (for any corpus
  split by `split_of`)."""
  if split not in SPLITS:
    raise ConfigError('eval.split', f'unknown split {split!r} of the {corpus} '
                      f'corpus; expected one of {SPLITS}')


def list_documents(split: str) -> list[str]:
  """Relative POSIX paths (under `stdlib_root()`) of a split, sorted.

  Raises:
    ConfigError: `split` is not 'train', 'valid' or 'test'.
  """
  check_split(split)
  return [p for p in _all_nonempty_sources() if split_of(p) == split]


def load_documents(split: str) -> list[Document]:
  """The documents of a split in `list_documents` order; names are the
  relative paths, data the files' raw bytes."""
  root = stdlib_root()
  return [Document(name=path, data=(root / path).read_bytes())
          for path in list_documents(split)]

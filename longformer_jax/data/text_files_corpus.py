"""The user's own text files as a corpus: `data.corpus` set to a path.

Design: a `data.corpus` value that contains a `/` or a glob character
(`*`, `?`, `[`) names the user's files instead of a built-in corpus (`./my
texts`, `/data/books`, `'/data/**/*.txt'`; `~` is expanded). A directory
means every file below it, recursively, except hidden files and folders
(names starting with `.`); any other value is a glob pattern (`**` matches
folders recursively), which may also name a single file. The same holds for
`gs://bucket/folder` and `gs://bucket/**/*.txt`.

Each file is one document, read as UTF-8 text (kept as its bytes). A file
that is empty or not valid UTF-8 is skipped with one warning line naming the
skipped files; if no usable file remains, a `ConfigError` says so.

Each file goes to train, valid or test by the stdlib corpus's rule
(`stdlib_corpus.split_of`: a stable hash of its path relative to the
directory, or to the fixed folder part of the glob), so the split does not
depend on where the files are mounted or on which other files exist. As for
the stdlib corpus, about 2% of the files are test and 2% valid: a corpus of
a few dozen files may have an empty valid or test split, which is reported
as a `ConfigError`.
"""

import glob
import os
import pathlib
import posixpath

from absl import logging
import fsspec

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.document import Document
from longformer_jax.data.stdlib_corpus import check_split
from longformer_jax.data.stdlib_corpus import split_of
from longformer_jax.storage import paths

_KEY = 'data.corpus'
_GLOB_CHARACTERS = frozenset('*?[')
_MAX_NAMED = 5


def is_text_files_corpus(corpus: str) -> bool:
  """Whether a `data.corpus` value names the user's files (has `/` or a glob)."""
  return '/' in corpus or bool(_GLOB_CHARACTERS & set(corpus))


def list_files(corpus: str) -> list[tuple[str, pathlib.Path]]:
  """`(relative POSIX path, path)` of every file `corpus` names, sorted.

  Raises:
    ConfigError: the directory does not exist, or the pattern matches no file.
  """
  if paths.is_remote(corpus):
    return _list_remote(corpus)
  pattern = os.path.expanduser(corpus)
  if os.path.isdir(pattern):
    root = pathlib.Path(pattern)
    files = []
    for folder, subfolders, names in os.walk(root):
      subfolders[:] = [d for d in subfolders if not d.startswith('.')]
      files += [pathlib.Path(folder) / n for n in names if not n.startswith('.')]
    if not files:
      raise ConfigError(_KEY, f'directory {corpus!r} holds no files')
  else:
    root = _fixed_folder(pattern)
    files = [pathlib.Path(p) for p in glob.glob(pattern, recursive=True)]
    files = [p for p in files if p.is_file()]
    if not files:
      what = 'matches no files' if _GLOB_CHARACTERS & set(pattern) else (
          'is not an existing directory or file')
      raise ConfigError(_KEY, f'{corpus!r} {what}')
  return sorted((path.relative_to(root).as_posix(), path) for path in files)


def _list_remote(corpus: str) -> list:
  """`list_files` of a `gs://` directory or glob (the same rules, through gcsfs)."""
  paths.check_bucket(corpus, _KEY)
  filesystem, pattern = fsspec.core.url_to_fs(corpus)

  def visible(name: str) -> bool:   # as on disk: no hidden file or folder below the root
    return not any(part.startswith('.') for part in posixpath.relpath(name, root).split('/'))

  if filesystem.isdir(pattern):
    root = pattern.rstrip('/')
    names = [name for name in filesystem.find(root) if visible(name)]
    if not names:
      raise ConfigError(_KEY, f'directory {corpus!r} holds no files')
  else:
    root = _fixed_folder(pattern).as_posix()
    names = [name for name in filesystem.glob(pattern)
             if visible(name) and filesystem.isfile(name)]
    if not names:
      what = 'matches no files' if _GLOB_CHARACTERS & set(pattern) else (
          'is not an existing directory or file')
      raise ConfigError(_KEY, f'{corpus!r} {what}')
  return sorted((posixpath.relpath(name, root), paths.as_path(f'gs://{name}'))
                for name in names)


def load_documents(corpus: str, split: str) -> list[Document]:
  """The usable documents of `split` of the files `corpus` names.

  Args:
    corpus: a `data.corpus` value for which `is_text_files_corpus` holds.
    split: 'train', 'valid' or 'test'.

  Returns:
    One document per non-empty UTF-8 file of the split, ordered by relative
    path; names are the relative paths, data the files' bytes.

  Raises:
    ConfigError: bad split, no files (see `list_files`), or no usable file
      in the split.
  """
  check_split(split, corpus)
  documents, skipped = [], []
  for name, path in list_files(corpus):
    if split_of(name) != split:
      continue
    data = path.read_bytes()
    problem = _problem(data)
    if problem:
      skipped.append(f'{name} ({problem})')
    else:
      documents.append(Document(name=name, data=data))
  if skipped:
    more = len(skipped) - _MAX_NAMED
    logging.warning('Skipped %d files of the %s split of %s that are not usable '
                    'text: %s%s', len(skipped), split, corpus,
                    ', '.join(skipped[:_MAX_NAMED]), f' and {more} more' if more > 0 else '')
  if not documents:
    raise ConfigError(_KEY, f'the {split} split of {corpus!r} has no usable file '
                      f'({len(skipped)} skipped as empty or not UTF-8); each file goes '
                      'to a split by a hash of its path (2% test, 2% valid), so add files')
  return documents


def _problem(data: bytes) -> str:
  """Why a file's bytes are not a usable document ('' if they are)."""
  if not data:
    return 'empty'
  try:
    data.decode('utf-8')
  except UnicodeDecodeError as error:
    return f'not UTF-8 at byte {error.start}'
  return ''


def _fixed_folder(pattern: str) -> pathlib.Path:
  """The leading folders of a glob pattern that hold no glob character."""
  parts = pathlib.Path(pattern).parts
  fixed = []
  for part in parts[:-1]:
    if _GLOB_CHARACTERS & set(part):
      break
    fixed.append(part)
  return pathlib.Path(*fixed) if fixed else pathlib.Path('.')

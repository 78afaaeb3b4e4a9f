"""Tests of the built-in standard-library corpus: listing and splitting."""

import os
import pathlib

import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import stdlib_corpus
from longformer_jax.data.document import Document


def independent_listing() -> set[str]:
  """All non-empty stdlib .py files outside site-/dist-packages."""
  root = stdlib_corpus.stdlib_root()
  found = set()
  for folder, subfolders, files in os.walk(root):
    subfolders[:] = [d for d in subfolders
                     if d not in ('site-packages', 'dist-packages')]
    for name in files:
      path = pathlib.Path(folder, name)
      if name.endswith('.py') and path.is_file() and path.stat().st_size > 0:
        found.add(path.relative_to(root).as_posix())
  return found


def test_root_is_the_standard_library():
  root = stdlib_corpus.stdlib_root()
  assert (root / 'os.py').is_file()


def test_order_is_sorted_and_deterministic():
  for split in stdlib_corpus.SPLITS:
    names = stdlib_corpus.list_documents(split)
    assert names == sorted(names)
    assert names == stdlib_corpus.list_documents(split)


def test_splits_are_disjoint_and_cover_all_nonempty_files():
  splits = {s: stdlib_corpus.list_documents(s) for s in stdlib_corpus.SPLITS}
  sets = {s: set(names) for s, names in splits.items()}
  assert sets['train'].isdisjoint(sets['valid'])
  assert sets['train'].isdisjoint(sets['test'])
  assert sets['valid'].isdisjoint(sets['test'])
  union = sets['train'] | sets['valid'] | sets['test']
  assert union == independent_listing()
  assert not any('site-packages' in n or 'dist-packages' in n for n in union)
  total = len(union)
  assert total > 500
  for split in ('valid', 'test'):
    fraction = len(sets[split]) / total
    assert 0.005 < fraction < 0.05, (split, fraction)
  assert 'os.py' in union


def test_split_depends_on_the_path_only():
  assert stdlib_corpus.split_of('os.py') == stdlib_corpus.split_of('os.py')
  buckets = [stdlib_corpus.split_of(f'file_{i}.py') for i in range(2000)]
  assert 0.01 < buckets.count('test') / 2000 < 0.03
  assert 0.01 < buckets.count('valid') / 2000 < 0.03


def test_load_documents_reads_the_files():
  documents = stdlib_corpus.load_documents('valid')
  assert [d.name for d in documents] == stdlib_corpus.list_documents('valid')
  root = stdlib_corpus.stdlib_root()
  for document in documents[:5]:
    assert isinstance(document, Document)
    assert document.data == (root / document.name).read_bytes()
    assert document.data


def test_unknown_split():
  with pytest.raises(ConfigError, match="'validation'") as error:
    stdlib_corpus.list_documents('validation')
  assert error.value.key == 'eval.split'

"""Tests of `longformer_jax.data.text_files_corpus`: the user's own text files."""

import logging
import pathlib

import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import text_files_corpus
from longformer_jax.data.stdlib_corpus import split_of
from longformer_jax.storage import paths
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import


def _names_in(split: str, count: int, pattern: str = 'doc_{}.txt') -> list[str]:
  """The first `count` names `pattern.format(i)` that fall into `split`."""
  names = (pattern.format(i) for i in range(10_000))
  return [name for name in names if split_of(name) == split][:count]


def _write(root: pathlib.Path, files: dict[str, bytes]) -> None:
  for name, data in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
def corpus_dir(tmp_path) -> pathlib.Path:
  """Two files of each split (one in a sub-folder), plus files to ignore."""
  root = tmp_path / 'texts'
  files = {}
  for split in ('train', 'valid', 'test'):
    for name in _names_in(split, 2) + _names_in(split, 1, 'sub/part_{}.md'):
      files[name] = f'{split} text of {name}\n'.encode()
  files['.hidden.txt'] = b'ignored'
  files['.git/objects/x'] = b'ignored'
  _write(root, files)
  return root


def test_is_text_files_corpus():
  assert text_files_corpus.is_text_files_corpus('./texts')
  assert text_files_corpus.is_text_files_corpus('/data/books')
  assert text_files_corpus.is_text_files_corpus('*.txt')
  assert not text_files_corpus.is_text_files_corpus('stdlib')
  assert not text_files_corpus.is_text_files_corpus('pg19')


def test_a_directory_is_split_by_relative_path(corpus_dir):
  seen = []
  for split in ('train', 'valid', 'test'):
    documents = text_files_corpus.load_documents(str(corpus_dir), split)
    names = [d.name for d in documents]
    assert names == sorted(names) and len(names) == 3
    assert all(split_of(name) == split for name in names)
    assert any(name.startswith('sub/') for name in names)
    for document in documents:
      assert document.data == (corpus_dir / document.name).read_bytes()
    seen += names
  assert not [name for name in seen if '.hidden' in name or '.git' in name]


def test_the_split_does_not_depend_on_where_the_files_are(corpus_dir, tmp_path):
  moved = tmp_path / 'elsewhere' / 'deeper'
  moved.parent.mkdir()
  corpus_dir.rename(moved)
  for split in ('train', 'valid', 'test'):
    assert all(split_of(d.name) == split
               for d in text_files_corpus.load_documents(str(moved), split))


def test_a_glob_selects_files_relative_to_its_fixed_folder(corpus_dir):
  txt = text_files_corpus.load_documents(f'{corpus_dir}/*.txt', 'train')
  assert [d.name for d in txt] == _names_in('train', 2)
  every = text_files_corpus.load_documents(f'{corpus_dir}/**/*.md', 'valid')
  assert [d.name for d in every] == _names_in('valid', 1, 'sub/part_{}.md')


def test_unusable_files_are_skipped_with_one_warning(tmp_path, caplog):
  good, empty, latin1 = _names_in('train', 3)
  _write(tmp_path, {good: b'fine', empty: b'', latin1: b'caf\xe9'})
  with caplog.at_level(logging.WARNING):
    documents = text_files_corpus.load_documents(str(tmp_path), 'train')
  assert [d.name for d in documents] == [good]
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and '\n' not in warnings[0]
  assert f'{empty} (empty)' in warnings[0]
  assert f'{latin1} (not UTF-8 at byte 3)' in warnings[0]


def test_a_split_without_usable_files_is_a_config_error(tmp_path):
  train, = _names_in('train', 1)
  valid, = _names_in('valid', 1)
  _write(tmp_path, {train: b'text', valid: b'\xff\xfe'})
  with pytest.raises(ConfigError) as raised:
    text_files_corpus.load_documents(str(tmp_path), 'valid')
  assert raised.value.key == 'data.corpus'
  assert str(tmp_path) in str(raised.value) and '1 skipped' in str(raised.value)
  with pytest.raises(ConfigError, match='test split'):
    text_files_corpus.load_documents(str(tmp_path), 'test')
  with pytest.raises(ConfigError) as raised:
    text_files_corpus.load_documents(str(tmp_path), 'dev')
  assert raised.value.key == 'eval.split'


@pytest.mark.parametrize('suffix, message', [
    ('/missing', 'is not an existing directory or file'),
    ('/*.nothing', 'matches no files'),
    ('/empty_dir', 'holds no files'),
])
def test_a_path_without_files_is_a_one_line_config_error(tmp_path, suffix,
                                                         message):
  (tmp_path / 'empty_dir').mkdir()
  corpus = f'{tmp_path}{suffix}'
  with pytest.raises(ConfigError, match=message) as raised:
    text_files_corpus.load_documents(corpus, 'train')
  assert raised.value.key == 'data.corpus'
  assert corpus in str(raised.value) and '\n' not in str(raised.value)


def test_a_gs_corpus_reads_as_the_same_files_on_disk(corpus_dir, gcs_bucket):
  remote = f'{gcs_bucket}/corpus'
  for path in corpus_dir.rglob('*'):
    if path.is_file():
      target = paths.as_path(f'{remote}/{path.relative_to(corpus_dir).as_posix()}')
      target.write_bytes(path.read_bytes())
  for corpus, local in ((remote, str(corpus_dir)), (f'{remote}/*.txt', f'{corpus_dir}/*.txt'),
                        (f'{remote}/**/*.md', f'{corpus_dir}/**/*.md')):
    for split in ('train', 'valid', 'test'):
      on_gcs = text_files_corpus.load_documents(corpus, split)
      assert on_gcs == text_files_corpus.load_documents(local, split), (corpus, split)
  with pytest.raises(ConfigError, match='data.corpus: .*matches no files'):
    text_files_corpus.list_files(f'{remote}/*.rst')
  with pytest.raises(ConfigError, match='data.corpus: .*bucket gs://no-such-bucket-z does not'):
    text_files_corpus.list_files('gs://no-such-bucket-z/texts')

"""Tests of the tfds corpora on small datasets that the tests prepare offline.

The data is written by the real tensorflow-datasets builders of
`tiny_shakespeare` and `pg19` (`builder.download_and_prepare()`), fed local
files the way tfds' own builder tests feed them: tiny_shakespeare's single
download is answered with a local `input.txt`, and pg19's source folder
(normally gs://deepmind-gutenberg) is pointed at a local folder holding
`metadata.csv` and `train/`, `validation/`, `test/` book files. The loader
under test then reads the prepared TFRecords through its normal path
(`tfds.builder(name, data_dir=...)`), with nothing mocked.
"""

import importlib
import importlib.resources
import sys

import ml_collections
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import corpus
from longformer_jax.data import tfds_corpus
from longformer_jax.data.data_config import DataConfig

SHAKESPEARE = ''.join(
    f'CITIZEN {i}:\nBefore we proceed any further, hear me speak.\n\n'
    for i in range(60))

# book_id -> (split, title, text); text without surrounding whitespace,
# which the pg19 builder strips.
BOOKS = {
    101: ('train', 'The First Book', 'Chapter I.\nIt was a dark night.'),
    102: ('train', 'Second Book', 'Ünïcödé café — “quoted” 中文.'),
    103: ('train', 'Third', 'Short.'),
    201: ('validation', 'A Valid Book', 'Validation text\nover two lines.'),
    301: ('test', 'Test Book', 'The end.'),
}


def _allow_tfds_building(monkeypatch):
  """tfds 4.9.10 imports `importlib_resources` when it prepares a dataset
  but declares the dependency only for Python < 3.9 (tensorflow/datasets
  issue 11212); the standard library's `importlib.resources` has what it
  uses. Reading prepared data does not need it."""
  try:
    importlib.import_module('importlib_resources')
  except ImportError:
    monkeypatch.setitem(sys.modules, 'importlib_resources',
                        importlib.resources)


def _prepare_tiny_shakespeare(tfds, data_dir, source_folder, monkeypatch):
  text_path = source_folder / 'input.txt'
  text_path.write_text(SHAKESPEARE, encoding='utf-8')
  monkeypatch.setattr(tfds.download.DownloadManager, 'download',
                      lambda self, url: str(text_path))
  builder = tfds.builder('tiny_shakespeare', data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def _prepare_pg19(tfds, data_dir, source_folder, monkeypatch):
  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.datasets.pg19 import pg19_dataset_builder
  metadata = ''.join(f'{book_id},{title},1900,http://example.org/{book_id}\n'
                     for book_id, (_, title, _) in BOOKS.items())
  (source_folder / 'metadata.csv').write_text(metadata, encoding='utf-8')
  for split in ('train', 'validation', 'test'):
    (source_folder / split).mkdir()
  for book_id, (split, _, text) in BOOKS.items():
    (source_folder / split / f'{book_id}.txt').write_text(text,
                                                          encoding='utf-8')
  assert tfds.builder_cls('pg19') is pg19_dataset_builder.Builder
  monkeypatch.setattr(pg19_dataset_builder, '_DATA_DIR',
                      tfds.core.Path(str(source_folder)))
  builder = tfds.builder('pg19', data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """A tfds data folder with small tiny_shakespeare and pg19 prepared."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('tfds')
  with pytest.MonkeyPatch.context() as monkeypatch:
    _allow_tfds_building(monkeypatch)
    (root / 'shakespeare_source').mkdir()
    _prepare_tiny_shakespeare(tfds, root / 'data', root / 'shakespeare_source',
                              monkeypatch)
    (root / 'pg19_source').mkdir()
    _prepare_pg19(tfds, root / 'data', root / 'pg19_source', monkeypatch)
  return str(root / 'data')


def test_tiny_shakespeare_splits(data_dir):
  texts = {}
  for split in ('train', 'valid', 'test'):
    documents = tfds_corpus.load_documents('tiny_shakespeare', split, data_dir)
    assert len(documents) == 1
    assert documents[0].name == f'tiny_shakespeare/{split}/0'
    assert isinstance(documents[0].data, bytes)
    texts[split] = documents[0].data.decode('utf-8')
  # The builder cuts the text 90/5/5 into train, validation and test.
  assert texts['train'] + texts['valid'] + texts['test'] == SHAKESPEARE
  assert len(texts['train']) > len(texts['valid']) > 0


@pytest.mark.parametrize('split,tfds_split', [
    ('train', 'train'), ('valid', 'validation'), ('test', 'test')])
def test_pg19_books(data_dir, split, tfds_split):
  documents = tfds_corpus.load_documents('pg19', split, data_dir)
  want = {f'pg19/{split}/{book_id} {title}': text.encode('utf-8')
          for book_id, (book_split, title, text) in BOOKS.items()
          if book_split == tfds_split}
  assert {d.name: d.data for d in documents} == want


def test_order_is_deterministic(data_dir):
  first = tfds_corpus.load_documents('pg19', 'train', data_dir)
  second = tfds_corpus.load_documents('pg19', 'train', data_dir)
  assert [d.name for d in first] == [d.name for d in second]


def test_load_corpus_dispatches_to_tfds(data_dir):
  config = ml_collections.ConfigDict({'corpus': 'pg19', 'tfds_data_dir': data_dir,
                                      'tfds_cache_dir': DataConfig.tfds_cache_dir})
  documents = corpus.load_corpus(config, 'valid')
  assert [d.name for d in documents] == ['pg19/valid/201 A Valid Book']


def test_unprepared_dataset_explains_how_to_prepare(tmp_path):
  with pytest.raises(ConfigError, match='tfds build pg19') as error:
    tfds_corpus.load_documents('pg19', 'train', str(tmp_path))
  assert error.value.key == 'data.tfds_data_dir'
  assert 'not prepared' in str(error.value)


def test_empty_or_missing_data_dir(tmp_path):
  with pytest.raises(ConfigError, match='tfds build tiny_shakespeare') as error:
    tfds_corpus.load_documents('tiny_shakespeare', 'train', '')
  assert error.value.key == 'data.tfds_data_dir'
  with pytest.raises(ConfigError) as error:
    tfds_corpus.load_documents('pg19', 'train', str(tmp_path / 'missing'))
  assert error.value.key == 'data.tfds_data_dir'


def test_unknown_split_and_corpus(data_dir):
  with pytest.raises(ConfigError) as error:
    tfds_corpus.load_documents('pg19', 'validation', data_dir)
  assert error.value.key == 'eval.split'
  with pytest.raises(ConfigError) as error:
    tfds_corpus.load_documents('imdb', 'train', data_dir)
  assert error.value.key == 'data.corpus'

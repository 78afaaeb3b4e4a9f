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

import ml_collections
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import corpus
from longformer_jax.data import tfds_corpus
from longformer_jax.data.data_config import DataConfig
from tests.support.offline_tfds import BOOKS, SHAKESPEARE


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

"""Fixtures more than one test module of tests/data_pipeline/ uses: small tensorflow-datasets
data prepared offline (tests/support/offline_tfds.py), once per test module that asks."""

import pytest

from tests.support.offline_tfds import (allow_tfds_building, prepare_imdb, prepare_pg19,
                                        prepare_tiny_shakespeare, prepare_trivia_qa)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """A tfds data folder with small tiny_shakespeare and pg19 prepared."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('tfds')
  with pytest.MonkeyPatch.context() as monkeypatch:
    allow_tfds_building(monkeypatch)
    (root / 'shakespeare_source').mkdir()
    prepare_tiny_shakespeare(tfds, root / 'data', root / 'shakespeare_source',
                             monkeypatch)
    (root / 'pg19_source').mkdir()
    prepare_pg19(tfds, root / 'data', root / 'pg19_source', monkeypatch)
  return str(root / 'data')


@pytest.fixture(scope='module')
def tfds_task_dir(tmp_path_factory):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('tfds_tasks')
  with pytest.MonkeyPatch.context() as monkeypatch:
    allow_tfds_building(monkeypatch)
    for name, prepare in (('imdb', prepare_imdb), ('trivia', prepare_trivia_qa)):
      (root / name).mkdir()
      prepare(tfds, root / 'data', root / name, monkeypatch)
  return str(root / 'data')

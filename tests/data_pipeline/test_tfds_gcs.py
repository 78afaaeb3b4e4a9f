"""tensorflow-datasets data in a gs:// `data.tfds_data_dir`, read through its local mirror.

The datasets are prepared offline by the real tfds builders (the fixture of
tests/data_pipeline/test_data_tfds_corpus.py), uploaded to a real GCS server on the
loopback address (tests/support/gcs_server.py: fake-gcs-server) through
`storage/paths.py`, and read back with `tfds_corpus.load_documents(...,
'gs://...')`, which copies the one dataset's prepared folder into a cache
folder (`data/tfds_mirror.py`) and hands that to tfds.
"""

import http.server
import json
import os
import pathlib
import threading

import fsspec
import gcsfs
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import corpus
from longformer_jax.data import qa_tasks
from longformer_jax.data import tfds_corpus
from longformer_jax.data import tfds_mirror
from longformer_jax.data.data_config import DataConfig
from longformer_jax.storage import paths
from tests.support.data_configs import data_config
from tests.support.gcs_server import BUCKET
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.refusing_gcs_server import REFUSALS, RefusingServer
from tests.support.tiny_tasks import TOKENIZER, tiny_task_config

SPLITS = ('train', 'valid', 'test')


def upload(local_folder: str, remote_folder: str) -> None:
  """Copies every file below `local_folder` to `remote_folder` through the path layer."""
  for name in paths.list_files(local_folder):
    target = paths.as_path(remote_folder).joinpath(*name.split('/'))
    target.write_bytes(pathlib.Path(local_folder, name).read_bytes())


def remove_remote(remote_folder: str) -> None:
  filesystem, name = fsspec.core.url_to_fs(remote_folder)
  filesystem.rm(name, recursive=True)


def read(name: str, split: str, folder: str, cache_dir=None) -> list:
  if cache_dir is None:
    documents = tfds_corpus.load_documents(name, split, folder)
  else:
    documents = tfds_corpus.load_documents(name, split, folder, str(cache_dir))
  return [(document.name, document.data) for document in documents]


@pytest.fixture
def count_downloads(monkeypatch):
  """The names of the files `paths.download_file` fetched, in order."""
  fetched = []
  download_file = paths.download_file

  def counting(source, target):
    fetched.append(os.path.basename(os.fspath(target)))
    download_file(source, target)

  monkeypatch.setattr(paths, 'download_file', counting)
  return fetched


@pytest.fixture(scope='module')
def gcs_data_dir(data_dir, gcs_bucket):
  """`gs://BUCKET/tfds_gcs/prepared`: the prepared folder of tiny_shakespeare and pg19."""
  remote = f'{gcs_bucket}/tfds_gcs/prepared'
  upload(data_dir, remote)
  return remote


def mirror_folder(cache_dir, remote_data_dir: str, dataset_folder: str) -> pathlib.Path:
  """Where `remote_data_dir/<dataset_folder>` is mirrored below `cache_dir`."""
  return pathlib.Path(cache_dir, *remote_data_dir[len('gs://'):].split('/'), dataset_folder)


def pg19_folder() -> str:
  """pg19's `<name>/<version>` below a data dir (pg19 has no builder configs)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return f'pg19/{tfds.builder_cls("pg19").VERSION}'


def test_gs_data_dir_gives_the_documents_of_the_local_folder(data_dir, gcs_data_dir, tmp_path):
  for name in ('pg19', 'tiny_shakespeare'):
    for split in SPLITS:
      assert read(name, split, gcs_data_dir, tmp_path) == read(name, split, data_dir), (name, split)
  # Only the prepared folders of the datasets read are copied (not the build's downloads/).
  root = pathlib.Path(tmp_path, BUCKET, 'tfds_gcs', 'prepared')
  assert sorted(p.name for p in root.iterdir()) == ['pg19', 'tiny_shakespeare']
  local = mirror_folder(tmp_path, gcs_data_dir, pg19_folder())
  remote_files = paths.list_files(f'{gcs_data_dir}/{pg19_folder()}')
  assert 'dataset_info.json' in remote_files and len(remote_files) > 2
  mirrored = paths.list_files(local)
  assert mirrored.pop(tfds_mirror.LOCK_NAME) == 0 and mirrored.pop(tfds_mirror.MANIFEST_NAME)
  assert mirrored == remote_files
  manifest = json.loads((local / tfds_mirror.MANIFEST_NAME).read_text())
  assert manifest == {'source': f'{gcs_data_dir}/{pg19_folder()}', 'files': remote_files}


def test_a_complete_mirror_is_read_without_the_bucket(data_dir, gcs_bucket, tmp_path,
                                                      count_downloads):
  remote = f'{gcs_bucket}/tfds_gcs/deleted_after_first_read'
  upload(os.path.join(data_dir, 'pg19'), f'{remote}/pg19')
  first = read('pg19', 'train', remote, tmp_path)
  assert 'dataset_info.json' in count_downloads
  downloads = len(count_downloads)
  remove_remote(remote)
  assert not paths.list_files(remote)
  assert read('pg19', 'train', remote, tmp_path) == first == read('pg19', 'train', data_dir)
  assert read('pg19', 'valid', remote, tmp_path) == read('pg19', 'valid', data_dir)
  assert len(count_downloads) == downloads


def cut_shard(local: pathlib.Path) -> str:
  """Cuts the first TFRecord shard of the mirror folder `local` to half; returns its name."""
  shard = sorted(p for p in local.iterdir() if '.tfrecord' in p.name)[0]
  data = shard.read_bytes()
  shard.write_bytes(data[:len(data) // 2])
  return shard.name


@pytest.mark.parametrize('damage', ['no_manifest', 'manifest_damaged', 'file_cut',
                                    'file_missing'])
def test_an_interrupted_or_damaged_mirror_is_made_again(data_dir, gcs_data_dir, tmp_path,
                                                        count_downloads, damage):
  want = read('pg19', 'train', data_dir)
  assert read('pg19', 'train', gcs_data_dir, tmp_path) == want
  local = mirror_folder(tmp_path, gcs_data_dir, pg19_folder())
  complete = paths.list_files(local)
  count_downloads.clear()
  manifest = local / tfds_mirror.MANIFEST_NAME
  if damage == 'no_manifest':       # stopped before the manifest: one file cut, strays left
    manifest.unlink()
    damaged = cut_shard(local)
    (local / paths.temporary_name(damaged)).write_bytes(b'half a file')
    (local / 'pg19-train.tfrecord-00000-of-00002').write_bytes(b'a shard the bucket lacks')
  elif damage == 'manifest_damaged':
    manifest.write_text('{"source": ')
    damaged = None
  elif damage == 'file_cut':
    damaged = cut_shard(local)
  else:
    damaged = 'features.json'
    (local / damaged).unlink()
  assert not tfds_mirror.is_complete(f'{gcs_data_dir}/{pg19_folder()}', str(local))
  assert read('pg19', 'train', gcs_data_dir, tmp_path) == want
  # Only the damaged file is fetched again; whole files are kept; strays are removed.
  assert count_downloads == ([damaged] if damaged else [])
  assert paths.list_files(local) == complete


def test_a_copy_that_breaks_off_is_finished_by_the_next_read(data_dir, gcs_data_dir, tmp_path,
                                                              monkeypatch):
  fetched = []
  download_file = paths.download_file

  def breaks_at_the_third_file(source, target):
    if len(fetched) == 2:
      raise ConnectionError('connection reset')
    fetched.append(os.path.basename(os.fspath(target)))
    download_file(source, target)

  monkeypatch.setattr(paths, 'download_file', breaks_at_the_third_file)
  with pytest.raises(ConnectionError):
    read('pg19', 'test', gcs_data_dir, tmp_path)
  local = mirror_folder(tmp_path, gcs_data_dir, pg19_folder())
  assert not (local / tfds_mirror.MANIFEST_NAME).exists()
  monkeypatch.setattr(paths, 'download_file', download_file)
  assert read('pg19', 'test', gcs_data_dir, tmp_path) == read('pg19', 'test', data_dir)
  assert (local / tfds_mirror.MANIFEST_NAME).is_file()


def test_unprepared_dataset_on_gs_is_the_local_folders_one_line_error(gcs_bucket, tmp_path):
  empty = f'{gcs_bucket}/tfds_gcs/empty'
  paths.as_path(empty).joinpath('other', 'file.txt').write_text('not a dataset')
  with pytest.raises(ConfigError, match='tfds build pg19') as error:
    tfds_corpus.load_documents('pg19', 'train', empty, str(tmp_path / 'cache'))
  assert error.value.key == 'data.tfds_data_dir'
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(f"config.data.tfds_data_dir: dataset 'pg19' version "
                            f"{pg19_folder().split('/')[1]} is not prepared under {empty!r} "
                            f"(looked in {empty}/{pg19_folder()});")
  assert not list((tmp_path / 'cache').rglob('*.json'))      # nothing copied


def test_missing_bucket_is_check_buckets_one_line(tmp_path):
  with pytest.raises(ConfigError) as error:
    tfds_corpus.load_documents('pg19', 'train', 'gs://no-such-bucket-tfds/tfds', str(tmp_path))
  assert error.value.key == 'data.tfds_data_dir'
  assert str(error.value).startswith(
      'config.data.tfds_data_dir: gs://no-such-bucket-tfds/tfds/pg19/')
  assert str(error.value).endswith(
      'bucket gs://no-such-bucket-tfds does not exist (create it with '
      '`gcloud storage buckets create gs://no-such-bucket-tfds`)')


def test_missing_credentials_are_check_buckets_one_line(tmp_path, monkeypatch):
  """A server that answers as GCS answers a caller without credentials (401)."""
  status, message, _ = REFUSALS[0]
  handler = type('Refusing', (RefusingServer,), {'status': status, 'message': message})
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', f'http://127.0.0.1:{server.server_port}')
  gcsfs.GCSFileSystem.clear_instance_cache()
  try:
    with pytest.raises(ConfigError, match=r'^config.data.tfds_data_dir: gs://private/tfds/pg19/'
                                          r'.*: no credentials for gs://private \(Anonymous'):
      tfds_corpus.load_documents('pg19', 'train', 'gs://private/tfds', str(tmp_path))
  finally:
    server.shutdown()
    server.server_close()
    gcsfs.GCSFileSystem.clear_instance_cache()


def test_the_corpus_loader_reads_gs_tfds_data_into_data_tfds_cache_dir(data_dir, gcs_data_dir,
                                                                      tmp_path):
  config = data_config(corpus='pg19', tfds_data_dir=gcs_data_dir,
                       tfds_cache_dir=str(tmp_path / 'tfds_cache'))
  documents = corpus.load_corpus(config, 'valid')
  assert [(d.name, d.data) for d in documents] == read('pg19', 'valid', data_dir)
  assert (mirror_folder(tmp_path / 'tfds_cache', gcs_data_dir, pg19_folder())
          / tfds_mirror.MANIFEST_NAME).is_file()


def test_a_task_reads_a_dataset_with_a_builder_config_from_gs(tfds_task_dir, gcs_bucket, tmp_path):
  """trivia_qa/rc: the mirrored folder is <name>/<config>/<version>, and only that config's."""
  remote = f'{gcs_bucket}/tfds_gcs/tasks'
  upload(os.path.join(tfds_task_dir, 'trivia_qa'), f'{remote}/trivia_qa')
  arrays = {}
  for where, cache in (('local', ''), ('gcs', str(tmp_path / 'cache'))):
    config = tiny_task_config('qa', corpus='trivia_qa', seq_len=64, question_len=24,
                              tfds_data_dir=tfds_task_dir if where == 'local' else remote)
    if cache:
      config.data.tfds_cache_dir = cache
    arrays[where] = qa_tasks.load_arrays(config, 'valid', TOKENIZER)
  assert arrays['gcs'].keys() == arrays['local'].keys()
  for key, value in arrays['local'].items():
    assert (arrays['gcs'][key] == value).all(), key
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  version = str(tfds.builder('trivia_qa/rc', data_dir=tfds_task_dir).version)
  mirrored = pathlib.Path(tmp_path, 'cache', BUCKET, 'tfds_gcs', 'tasks', 'trivia_qa')
  assert [p.relative_to(mirrored).as_posix() for p in mirrored.rglob('*') if p.is_dir()] == [
      'rc', f'rc/{version}']
  assert (mirrored / 'rc' / version / tfds_mirror.MANIFEST_NAME).is_file()


def test_tfds_cache_dir_is_a_local_folder():
  assert DataConfig.build({}, 'data').tfds_cache_dir == '~/.cache/longformer_jax/tfds'
  for bad in ('', 'gs://bucket/cache'):
    with pytest.raises(ConfigError, match='must be a local folder') as error:
      DataConfig.build({'tfds_cache_dir': bad}, 'data')
    assert error.value.key == 'data.tfds_cache_dir'


def test_a_data_dir_that_leaves_the_cache_is_refused(tmp_path):
  with pytest.raises(ConfigError, match='without . or ..') as error:
    tfds_corpus.load_documents('pg19', 'train', 'gs://bucket/../outside', str(tmp_path))
  assert error.value.key == 'data.tfds_data_dir'

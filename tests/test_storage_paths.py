"""Local and gs:// paths through one library (longformer_jax/storage/paths.py).

The gs:// tests run against a real GCS server on the loopback address
(tests/gcs_server.py: fake-gcs-server), through the same gcsfs client a TPU VM uses.
"""

import os
import urllib.request

import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths
from tests.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import


def test_local_paths_are_absolute_and_written_whole(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(paths.as_path('run/config.json')) == str(tmp_path / 'run' / 'config.json')
  paths.write_text_atomically('run/config.json', 'old')
  paths.write_text_atomically('run/config.json', 'new')
  assert (tmp_path / 'run' / 'config.json').read_text() == 'new'
  assert sorted(os.listdir(tmp_path / 'run')) == ['config.json']   # no temporary left
  paths.move_aside('run', 'run.broken')
  assert (tmp_path / 'run.broken' / 'config.json').read_text() == 'new'
  assert not (tmp_path / 'run').exists()
  paths.check_bucket(tmp_path, '--workdir')       # local: nothing to check


def test_gs_paths_write_read_list_and_replace(gcs_bucket):
  run = paths.as_path(f'{gcs_bucket}/paths/run')
  assert os.fspath(run) == f'{gcs_bucket}/paths/run'
  paths.write_text_atomically(run / 'config.json', '{"step": 1}')
  paths.write_text_atomically(run / 'config.json', '{"step": 2}')
  assert (run / 'config.json').read_text() == '{"step": 2}'
  (run / 'metrics.jsonl').write_text('{"loss": 1.0}\n')
  assert sorted(p.name for p in run.glob('*.json*')) == ['config.json', 'metrics.jsonl']
  assert run.is_dir() and not (run / 'missing.json').exists()


def test_gs_move_aside_moves_every_object_of_a_folder(gcs_bucket):
  root = paths.as_path(f'{gcs_bucket}/move')
  for name in ('step/a.txt', 'step/inner/b.txt', 'step/inner/deeper/c.txt'):
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(name)
  paths.move_aside(root / 'step', root / 'step.broken')
  assert not (root / 'step').exists()
  for name in ('a.txt', 'inner/b.txt', 'inner/deeper/c.txt'):
    assert (root / 'step.broken' / name).read_text() == f'step/{name}'


def test_missing_bucket_is_one_line_naming_the_flag(gcs_bucket):
  paths.check_bucket(f'{gcs_bucket}/any/run', '--workdir')
  with pytest.raises(ConfigError, match=r'--workdir: gs://no-such-bucket-x/run: bucket '
                                        r'gs://no-such-bucket-x does not exist \(create it'):
    paths.check_bucket('gs://no-such-bucket-x/run', '--workdir')


def test_a_listing_sees_what_another_client_wrote_since(gcs_bucket, gcs_server_url):
  folder = paths.as_path(f'{gcs_bucket}/listing')
  (folder / 'a.txt').write_text('a')
  assert [p.name for p in folder.iterdir()] == ['a.txt']
  # Another process (here: a plain HTTP upload to the server) adds an object.
  bucket = gcs_bucket[len('gs://'):]
  request = urllib.request.Request(
      f'{gcs_server_url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name=listing/b.txt',
      data=b'b', method='POST', headers={'Content-Type': 'text/plain'})
  urllib.request.urlopen(request, timeout=30).close()
  assert sorted(p.name for p in folder.iterdir()) == ['a.txt', 'b.txt']

"""Local and gs:// paths through one library (longformer_jax/storage/paths.py).

The gs:// tests run against a real GCS server on the loopback address
(tests/support/gcs_server.py: fake-gcs-server), through the same gcsfs client a TPU VM uses.
"""

import http.server
import logging
import os
import threading
import urllib.request

import fsspec
import gcsfs
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.refusing_gcs_server import REFUSALS, RefusingServer


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


def test_gs_files_are_listed_with_sizes_and_downloaded_whole(gcs_bucket, tmp_path, monkeypatch):
  folder = paths.as_path(f'{gcs_bucket}/listed')
  for name, text in (('a.json', '{}'), ('inner/b.bin', 'bbbb'), ('inner/deeper/c', '')):
    folder.joinpath(*name.split('/')).write_text(text)
  (paths.as_path(f'{gcs_bucket}/listed_other') / 'x').write_text('not below listed/')
  want = {'a.json': 2, 'inner/b.bin': 4, 'inner/deeper/c': 0}
  assert paths.list_files(folder) == want
  assert paths.list_files(f'{gcs_bucket}/listed/') == want
  assert paths.list_files(f'{gcs_bucket}/no_such_folder') == {}
  target = tmp_path / 'copy' / 'b.bin'
  paths.download_file(folder / 'inner' / 'b.bin', target)
  assert target.read_text() == 'bbbb' and paths.list_files(tmp_path) == {'copy/b.bin': 4}
  # A download that breaks off leaves the file as it was, never a part of the new one.
  filesystem = fsspec.core.url_to_fs(os.fspath(folder))[0]   # the client download_file takes

  def broken_get_file(remote, local, **kwargs):
    del remote, kwargs
    with open(local, 'wb') as f:
      f.write(b'pa')
    raise ConnectionError('connection reset')

  monkeypatch.setattr(filesystem, 'get_file', broken_get_file)
  with pytest.raises(ConnectionError):
    paths.download_file(folder / 'a.json', target)
  assert target.read_text() == 'bbbb'


def test_missing_bucket_is_one_line_naming_the_flag(gcs_bucket):
  paths.check_bucket(f'{gcs_bucket}/any/run', '--workdir')
  with pytest.raises(ConfigError, match=r'--workdir: gs://no-such-bucket-x/run: bucket '
                                        r'gs://no-such-bucket-x does not exist \(create it'):
    paths.check_bucket('gs://no-such-bucket-x/run', '--workdir')


@pytest.mark.parametrize('status, message, error', REFUSALS, ids=['401', '403'])
def test_refused_credentials_are_one_line_naming_the_flag(monkeypatch, caplog, status, message,
                                                         error):
  """Missing credentials and credentials without access each give one line, at once (no
  retries), and gcsfs's own traceback of the refusal is not shown (logged at warning or above)."""
  handler = type('Refusing', (RefusingServer,), {'status': status, 'message': message})
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', f'http://127.0.0.1:{server.server_port}')
  gcsfs.GCSFileSystem.clear_instance_cache()   # clients are cached with their endpoint
  try:
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError, match=error):
      paths.check_bucket('gs://private/run', '--workdir')
    shown = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
    assert not shown, 'gcsfs logged a traceback'
  finally:
    server.shutdown()
    server.server_close()
    gcsfs.GCSFileSystem.clear_instance_cache()


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

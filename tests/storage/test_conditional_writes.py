"""Compare-and-swap writes of one small file (longformer_jax/storage/conditional_writes.py),
on a local disk and on gs:// (tests/support/gcs_server.py: a real GCS server on loopback, through
the gcsfs client users run): of writers racing from one version, exactly one wins."""

import os
import threading

import pytest

from longformer_jax.storage import conditional_writes
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import


@pytest.fixture(params=['local', 'gs'])
def folder(request, tmp_path):
  if request.param == 'local':
    return str(tmp_path / 'run')
  return f'{request.getfixturevalue("gcs_bucket")}/cas/{os.path.basename(tmp_path)}'


def test_each_write_needs_the_version_it_saw(folder):
  path = f'{folder}/lease.json'
  assert conditional_writes.read(path) is None
  first = conditional_writes.create(path, b'one')
  with pytest.raises(conditional_writes.VersionChangedError):
    conditional_writes.create(path, b'two')                   # exists: refused
  assert conditional_writes.read(path) == (b'one', first)
  second = conditional_writes.replace(path, b'three', first)
  assert second != first
  with pytest.raises(conditional_writes.VersionChangedError):
    conditional_writes.replace(path, b'four', first)          # another writer was first
  with pytest.raises(conditional_writes.VersionChangedError):
    conditional_writes.delete(path, first)
  assert conditional_writes.read(path) == (b'three', second)
  conditional_writes.delete(path, second)
  assert conditional_writes.read(path) is None
  with pytest.raises(conditional_writes.VersionChangedError):
    conditional_writes.replace(path, b'five', second)         # gone: nothing to replace
  if not folder.startswith('gs://'):
    assert sorted(os.listdir(folder)) == ['.lease.json.guard']   # no temporary file left


@pytest.mark.parametrize('operation', ['create', 'replace'])
def test_of_racing_writers_exactly_one_wins(folder, operation):
  path = f'{folder}/race.json'
  version = None
  if operation == 'replace':
    version = conditional_writes.create(path, b'stale')
  start, won, lost = threading.Barrier(6), [], []

  def write(i):
    data = f'writer {i}'.encode()
    start.wait()
    try:
      if operation == 'create':
        conditional_writes.create(path, data)
      else:
        conditional_writes.replace(path, data, version)
      won.append(data)
    except conditional_writes.VersionChangedError:
      lost.append(i)

  threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert len(won) == 1 and len(lost) == 5, (won, lost)
  assert conditional_writes.read(path)[0] == won[0]

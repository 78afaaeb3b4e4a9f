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

import os

# Read by etils at each call and by gcsfs at import: set before either sees a gs:// path.
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
  temporary = target.parent / f'.{target.name}.tmp'
  temporary.write_text(text, encoding='utf-8')
  os.replace(temporary, target)


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
  filesystem, _ = fsspec.core.url_to_fs(text)
  try:
    exists = filesystem.exists(bucket)
  except PermissionError as error:
    raise ConfigError(flag, f'{text}: no access to bucket gs://{bucket} ({error})') from None
  except OSError as error:
    if 'credential' in str(error).lower() or '401' in str(error):
      raise ConfigError(flag, f'{text}: no credentials for gs://{bucket}: {CREDENTIALS_HELP}'
                        ) from None
    raise
  if not exists:
    raise ConfigError(flag, f'{text}: bucket gs://{bucket} does not exist (create it with '
                      f'`gcloud storage buckets create gs://{bucket}`)')

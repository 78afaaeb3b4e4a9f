"""A local copy of one tensorflow-datasets dataset prepared in a `gs://` folder.

tfds reads its records with TensorFlow's own GCS client, whose endpoint is
fixed, so a `data.tfds_data_dir` on `gs://` is read from local disk instead:
the prepared folder of the one dataset a run asks for,
`gs://BUCKET/DIR/<name>/<config>/<version>/` (every file in it, nothing else of
the bucket), is copied through `storage/paths.py` (gcsfs, the client every
other `gs://` path takes) to `<data.tfds_cache_dir>/BUCKET/DIR/<name>/<config>/<version>/`,
and tfds is handed `<data.tfds_cache_dir>/BUCKET/DIR`. The cost: one copy of
the prepared dataset on local disk.

Read: the listing and the files of the remote folder, only while the mirror
is not complete. Written, in the mirror folder: each file under a temporary
name, renamed when whole; then, last, the manifest `MANIFEST_NAME`
(`{"source": remote folder, "files": {name: bytes}}`). A mirror is complete
when its manifest names the remote folder and every file it lists has its
size; a complete mirror is reused without asking the bucket (a prepared tfds
version is not rewritten in place; delete the folder to copy it again). Any
other mirror (a copy that was interrupted, a file cut or removed, no
manifest) is made again: the files whose size differs from the bucket's are
copied again, files the bucket does not hold (leftover temporaries) are
removed. One process of a host copies at a time (a lock file beside the
manifest); the others wait, then find the mirror complete.
"""

import contextlib
import fcntl
import json
import os

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths

MANIFEST_NAME = '.longformer_jax_mirror.json'
LOCK_NAME = '.longformer_jax_mirror.lock'
# The remote folder holds a prepared dataset only if it has this file (tfds writes it last).
PREPARED_MARKER = 'dataset_info.json'


def local_data_dir(data_dir: str, cache_dir: str, key: str) -> str:
  """The local folder that mirrors the `gs://` folder `data_dir`: `<cache_dir>/BUCKET/DIR`.

  Args:
    data_dir: `gs://BUCKET/DIR` (the config value of `key`).
    cache_dir: a local folder (`~` is expanded).
    key: the config key of `data_dir`, for the error.

  Raises:
    ConfigError: `data_dir` has a `.` or `..` component (it would leave `cache_dir`).
  """
  parts = [part for part in data_dir[len('gs://'):].split('/') if part]
  if not parts or any(part in ('.', '..') for part in parts):
    raise ConfigError(key, f'{data_dir!r} must be gs://BUCKET or gs://BUCKET/FOLDER '
                      'without . or .. in it')
  return os.fspath(paths.as_path(os.path.expanduser(cache_dir)).joinpath(*parts))


def mirror_folder(remote_folder: str, local_folder: str, key: str) -> bool:
  """Makes `local_folder` a complete copy of the prepared dataset folder `remote_folder`.

  Args:
    remote_folder: `gs://.../<name>/<config>/<version>`.
    local_folder: where its copy goes (created if missing).
    key: the config key the path came from, for the bucket's errors.

  Returns:
    True when `local_folder` is a complete copy (made now or before); False when
    `remote_folder` holds no prepared dataset (no `PREPARED_MARKER`), nothing written.

  Raises:
    ConfigError: (only when copying) the bucket does not exist, or refuses the caller.
  """
  if is_complete(remote_folder, local_folder):
    return True
  paths.check_bucket(remote_folder, key)
  remote_files = paths.list_files(remote_folder)
  if PREPARED_MARKER not in remote_files:
    return False
  os.makedirs(local_folder, exist_ok=True)
  with _only_process(local_folder):
    if is_complete(remote_folder, local_folder):   # another process of this host made it
      return True
    _copy_files(remote_folder, local_folder, remote_files)
  return True


def is_complete(remote_folder: str, local_folder: str) -> bool:
  """True when `local_folder`'s manifest names `remote_folder` and every file it lists is
  there with its size (reads only local files)."""
  manifest = _read_manifest(local_folder)
  if not manifest or manifest.get('source') != remote_folder:
    return False
  files = manifest.get('files')
  if not isinstance(files, dict) or PREPARED_MARKER not in files:
    return False
  return all(_local_size(local_folder, name) == size for name, size in files.items())


def _copy_files(remote_folder: str, local_folder: str, remote_files: dict) -> None:
  """Removes what the bucket does not hold (the old manifest first: the mirror is complete
  only when it is written again), copies the files whose local size differs from the
  bucket's, and writes the manifest last."""
  for name in sorted(paths.list_files(local_folder)):
    if name not in remote_files and name != LOCK_NAME:
      os.remove(os.path.join(local_folder, *name.split('/')))
  remote = paths.as_path(remote_folder)
  for name, size in sorted(remote_files.items()):
    if _local_size(local_folder, name) == size:
      continue                    # landed whole by rename in an earlier, interrupted copy
    target = os.path.join(local_folder, *name.split('/'))
    paths.download_file(remote.joinpath(*name.split('/')), target)
    if os.path.getsize(target) != size:
      raise OSError(f'{remote_folder}/{name} changed while it was copied to {target} '
                    f'({os.path.getsize(target)} bytes, listed with {size}); run again')
  paths.write_text_atomically(os.path.join(local_folder, MANIFEST_NAME), json.dumps(
      {'source': remote_folder, 'files': dict(sorted(remote_files.items()))}, indent=1))


def _read_manifest(local_folder: str) -> dict | None:
  try:
    with open(os.path.join(local_folder, MANIFEST_NAME), encoding='utf-8') as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return None
  return manifest if isinstance(manifest, dict) else None


def _local_size(local_folder: str, name: str) -> int | None:
  path = os.path.join(local_folder, *name.split('/'))
  return os.path.getsize(path) if os.path.isfile(path) else None


@contextlib.contextmanager
def _only_process(local_folder: str):
  """Holds an exclusive lock on `local_folder`'s lock file (waits for another holder)."""
  with open(os.path.join(local_folder, LOCK_NAME), 'a', encoding='utf-8') as lock_file:
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock_file, fcntl.LOCK_UN)

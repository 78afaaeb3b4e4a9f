"""Small files written only if they are still what the writer last saw (compare-and-swap).

One file (the workdir's lease, `checkpoint/workdir_lease.py`) that several processes,
perhaps on several hosts, may try to create, replace or delete at once. Every operation
names the version it expects, and exactly one of two racing writers wins:

  create(path, data)            -> version; `VersionChangedError` if the file exists
  read(path)                    -> (data, version), or None if there is no file
  replace(path, data, version)  -> new version; `VersionChangedError` unless the file
                                   is still at `version`
  delete(path, version)         -> `VersionChangedError` unless the file is at `version`

On `gs://` a version is the object's generation and each write carries GCS's
precondition `ifGenerationMatch` (0 for "only if absent"), so the server decides. A
local file's version is the SHA-256 of its bytes (a writer always writes new bytes: a
new time and token); a create links a complete temporary file to the name (`link`
fails if the name exists, so no reader ever sees a part), and the read-compare-write of
`replace` and `delete` holds an `flock` on a guard file beside it (`.<name>.guard`,
never deleted), which every process of the host (and of NFS clients that lock) honours.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import uuid

import fsspec

from longformer_jax.storage import paths


class VersionChangedError(Exception):
  """The file is not at the version the writer expected (it exists on create; another
  writer replaced or deleted it on replace or delete)."""


def create(path, data: bytes) -> str:
  """Writes `data` to `path` only if nothing is there; returns its version."""
  if paths.is_remote(path):
    return _gcs_upload(path, data, generation='0')
  target = os.fspath(paths.as_path(path))
  os.makedirs(os.path.dirname(target), exist_ok=True)
  temporary = _write_temporary(target, data)
  try:
    os.link(temporary, target)
  except FileExistsError:
    raise VersionChangedError(f'{target} exists') from None
  finally:
    os.unlink(temporary)
  return _digest(data)


def read(path) -> 'tuple[bytes, str] | None':
  """`(data, version)` of `path`, or None when there is no such file."""
  if paths.is_remote(path):
    return _gcs_read(path)
  target = os.fspath(paths.as_path(path))
  try:
    with open(target, 'rb') as file:
      data = file.read()
  except FileNotFoundError:
    return None
  return data, _digest(data)


def replace(path, data: bytes, version: str) -> str:
  """Writes `data` over `path` only if it is still at `version`; returns the new version."""
  if paths.is_remote(path):
    return _gcs_upload(path, data, generation=version)
  target = os.fspath(paths.as_path(path))
  with _guard(target):
    _check_local_version(target, version)
    temporary = _write_temporary(target, data)
    os.replace(temporary, target)
  return _digest(data)


def delete(path, version: str) -> None:
  """Deletes `path` only if it is still at `version`."""
  if paths.is_remote(path):
    # GCS decides by the precondition; the look first also holds where a server ignores a
    # DELETE's precondition (the tests' fake-gcs-server does).
    filesystem, bucket, key = _gcs_object(path)
    try:
      if str(filesystem.call('GET', 'b/{}/o/{}', bucket, key, json_out=True)['generation']) \
          != version:
        raise FileExistsError(path)
      filesystem.call('DELETE', 'b/{}/o/{}', bucket, key, ifGenerationMatch=version)
    except (FileExistsError, FileNotFoundError):   # 412: another generation; 404: gone
      raise VersionChangedError(f'{path} is no longer at generation {version}') from None
    return
  target = os.fspath(paths.as_path(path))
  with _guard(target):
    _check_local_version(target, version)
    os.unlink(target)


def _digest(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _write_temporary(target: str, data: bytes) -> str:
  """A complete, flushed file beside `target` under a name no other writer uses."""
  temporary = os.path.join(os.path.dirname(target),
                           f'.{os.path.basename(target)}.{uuid.uuid4().hex}.tmp')
  with open(temporary, 'wb') as file:
    file.write(data)
    file.flush()
    os.fsync(file.fileno())
  return temporary


def _check_local_version(target: str, version: str) -> None:
  found = read(target)
  if found is None or found[1] != version:
    raise VersionChangedError(f'{target} is no longer at the version this writer wrote')


@contextlib.contextmanager
def _guard(target: str):
  """An exclusive `flock` on `.<name>.guard` beside `target` for the read-compare-write."""
  guard = os.path.join(os.path.dirname(target), f'.{os.path.basename(target)}.guard')
  descriptor = os.open(guard, os.O_CREAT | os.O_RDWR, 0o644)
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    yield
  finally:
    os.close(descriptor)              # closing releases the lock


def _gcs_object(path) -> tuple:
  """`(gcsfs filesystem, bucket, object name)` of a `gs://` path."""
  filesystem, name = fsspec.core.url_to_fs(os.fspath(path))
  bucket, key, _ = filesystem.split_path(name)
  return filesystem, bucket, key


def _gcs_upload(path, data: bytes, generation: str) -> str:
  """One multipart upload with `ifGenerationMatch=generation`; the new generation.

  gcsfs's `pipe_file(mode='create')` has only the "absent" precondition; its own upload
  request is repeated here with any generation (GCS answers 412, which gcsfs raises as
  `FileExistsError`, when the object is at another one).
  """
  filesystem, bucket, key = _gcs_object(path)
  boundary = uuid.uuid4().hex
  body = (f'--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n'
          f'{json.dumps({"name": key})}\r\n--{boundary}\r\n'
          f'Content-Type: application/octet-stream\r\n\r\n').encode() + data + (
              f'\r\n--{boundary}--').encode()
  try:
    reply = filesystem.call(
        'POST', f'{filesystem._location}/upload/storage/v1/b/{bucket}/o',  # pylint: disable=protected-access
        uploadType='multipart', ifGenerationMatch=generation,
        headers={'Content-Type': f'multipart/related; boundary="{boundary}"'},
        data=body, json_out=True)
  except FileExistsError:
    raise VersionChangedError(f'{path} is not at generation {generation}') from None
  return str(reply['generation'])


def _gcs_read(path) -> 'tuple[bytes, str] | None':
  """The object's bytes and generation, read as one version (the bytes by generation)."""
  filesystem, bucket, key = _gcs_object(path)
  for _ in range(5):
    try:
      metadata = filesystem.call('GET', 'b/{}/o/{}', bucket, key, json_out=True)
    except FileNotFoundError:
      return None
    try:
      _, data = filesystem.call('GET', 'b/{}/o/{}', bucket, key, alt='media',
                                generation=metadata['generation'])
    except FileNotFoundError:       # replaced between the two requests: read the new one
      continue
    return data, str(metadata['generation'])
  raise VersionChangedError(f'{path} kept changing while it was read')

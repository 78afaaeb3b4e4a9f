"""The safetensors file format: headers read and checked, tensors read one at a time, and
files written tensor by tensor. Local or gs:// paths (storage/paths.py).

A file is an 8-byte little-endian header length, a JSON header of
`{name: {dtype, shape, data_offsets}}` (plus an optional `__metadata__` of strings),
then the tensors' bytes. `read_entries` checks every entry against the file's size, so
a truncated file is named before anything is read; `read_tensor` reads one tensor
straight into its numpy array (`readinto`: no intermediate copy, no memory map whose
pages would stay resident); `write_file` writes arrays one after another and returns
each tensor's CRC-32 (what a reader checks the bytes it reads against). bfloat16,
which numpy cannot name, is `ml_dtypes.bfloat16`. Nothing here imports torch.
"""

from concurrent import futures
import dataclasses
import json
import os
import struct
import zlib
from typing import Iterable

import ml_dtypes
import numpy as np

from longformer_jax.storage import paths

# The format's dtype names.
STORED_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
                 'BF16': ml_dtypes.bfloat16, 'I64': np.int64, 'I32': np.int32,
                 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}
DTYPE_NAMES = {np.dtype(dtype): name for name, dtype in STORED_DTYPES.items()}
MAX_HEADER_BYTES = 100 * 2**20   # the format's own limit
CRC_BLOCK_BYTES = 64 * 2**20     # CRC-32 over at most this many bytes at a time


class SafetensorsError(ValueError):
  """A file that is not a readable safetensors file; the message names the file."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
  """Where one tensor lies: its file, dtype, shape and byte range in the file."""
  path: str
  dtype: np.dtype
  shape: tuple
  start: int
  end: int


def _open(path: str, mode: str):
  return paths.as_path(path).open(mode) if paths.is_remote(path) else open(path, mode)


def _size(path: str) -> int:
  return paths.as_path(path).stat().length if paths.is_remote(path) else os.path.getsize(path)


def read_entries(path: str) -> dict[str, TensorEntry]:
  """The tensors of the file at `path`, by name, each checked to lie inside the file."""
  def corrupt(reason: str) -> SafetensorsError:
    return SafetensorsError(f'{path}: not a readable safetensors file (truncated or '
                            f'corrupt?): {reason}')
  size = _size(path)
  with _open(path, 'rb') as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise corrupt('shorter than its 8-byte header length')
    (header_len,) = struct.unpack('<Q', prefix)
    if header_len > min(MAX_HEADER_BYTES, size - 8):
      raise corrupt(f'header length {header_len} exceeds the file')
    try:
      header = json.loads(f.read(header_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise corrupt(f'header is not JSON ({e})') from None
  if not isinstance(header, dict):
    raise corrupt('header is not a JSON object')
  data_start = 8 + header_len
  entries = {}
  for name, entry in header.items():
    if name == '__metadata__':
      continue
    try:
      dtype = np.dtype(STORED_DTYPES[entry['dtype']])
      shape = tuple(int(n) for n in entry['shape'])
      start, end = (int(n) for n in entry['data_offsets'])
    except (KeyError, TypeError, ValueError) as e:
      raise corrupt(f'tensor {name!r} has a bad entry {entry!r} ({type(e).__name__})') from None
    if end - start != int(np.prod(shape)) * dtype.itemsize or start < 0:
      raise corrupt(f'tensor {name!r}: offsets {start}-{end} do not hold {shape} {dtype}')
    if data_start + end > size:
      raise corrupt(f'tensor {name!r} ends at byte {data_start + end} of {size}')
    entries[name] = TensorEntry(path, dtype, shape, data_start + start, data_start + end)
  return entries


def read_tensor(entry: TensorEntry, name: str = '') -> np.ndarray:
  """The tensor of `entry` as stored, read straight into a new array."""
  array = np.empty(entry.shape, entry.dtype)
  if entry.end > entry.start:
    try:
      with _open(entry.path, 'rb') as f:
        f.seek(entry.start)
        read = f.readinto(memoryview(array.reshape(-1).view(np.uint8)))
    except OSError as e:
      raise SafetensorsError(f'{entry.path}: cannot read tensor {name!r}: {e}') from None
    if read != entry.end - entry.start:
      raise SafetensorsError(f'{entry.path}: not a readable safetensors file (truncated or '
                             f'corrupt?): tensor {name!r} ends past the file')
  return array


def crc32(array: np.ndarray) -> int:
  """CRC-32 of the bytes of a C-contiguous `array`, in blocks (no copy)."""
  data = memoryview(array.reshape(-1).view(np.uint8))
  value = 0
  for start in range(0, len(data), CRC_BLOCK_BYTES):
    value = zlib.crc32(data[start:start + CRC_BLOCK_BYTES], value)
  return value


def write_file(path: str, tensors: Iterable[tuple[str, np.ndarray]]) -> dict[str, int]:
  """Writes `(name, array)` pairs (a list: the header needs every shape first) to `path`
  in the safetensors layout, one array at a time (a non-contiguous view is copied alone);
  returns `{name: CRC-32 of its bytes}`."""
  tensors = list(tensors)
  header, offset = {}, 0
  for name, array in tensors:
    dtype = np.dtype(array.dtype)
    if dtype not in DTYPE_NAMES:
      raise ValueError(f'tensor {name!r}: dtype {dtype} has no safetensors name')
    nbytes = array.size * dtype.itemsize
    header[name] = {'dtype': DTYPE_NAMES[dtype], 'shape': list(array.shape),
                    'data_offsets': [offset, offset + nbytes]}
    offset += nbytes
  encoded = json.dumps(header, separators=(',', ':')).encode()
  encoded += b' ' * (-len(encoded) % 8)          # the format's 8-byte alignment
  checksums = {}
  # Each tensor's CRC-32 runs in a second thread while its bytes are written (both release
  # the GIL on large buffers): the two take about as long each.
  with _open(path, 'wb') as f, futures.ThreadPoolExecutor(1) as crc_thread:
    f.write(struct.pack('<Q', len(encoded)) + encoded)
    for name, array in tensors:
      contiguous = np.ascontiguousarray(array)
      pending = crc_thread.submit(crc32, contiguous)
      f.write(memoryview(contiguous.reshape(-1).view(np.uint8)))
      checksums[name] = pending.result()
      del contiguous
  return checksums

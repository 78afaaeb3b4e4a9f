"""Reading a Hugging Face directory's `*.safetensors` into numpy, tensor by tensor, and
checking each tensor.

One file (`model.safetensors`) or shards listed by `model.safetensors.index.json`.
A safetensors file is an 8-byte little-endian header length, a JSON header of
`{name: {dtype, shape, data_offsets}}`, then the tensors' bytes. `SafetensorsFiles`
reads every header once (checking that each tensor's bytes lie inside its file, so a
truncated file is named before anything is read) and then reads one tensor at a time,
straight into its numpy array (`readinto`: no intermediate copy, no memory map whose
pages would stay resident). So an import holds the tensors it has converted and one
more, never the whole checkpoint twice. bfloat16, which numpy cannot name, is
`ml_dtypes.bfloat16`. Nothing here imports torch.

`TensorSource.take(name, shape)` reads a tensor when the mapping asks for it,
checking its shape first; `TensorSource.check_all_used()` then names any tensor no
parameter took.
"""

import json
import os
import struct
from typing import Collection, Optional

import ml_dtypes
import numpy as np

from longformer_jax.convert.errors import ConversionError

INDEX_FILE = 'model.safetensors.index.json'
SINGLE_FILE = 'model.safetensors'
DTYPES = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}   # cast targets
# The safetensors format's dtype names.
STORED_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
                 'BF16': ml_dtypes.bfloat16, 'I64': np.int64, 'I32': np.int32,
                 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}
MAX_HEADER_BYTES = 100 * 2**20   # the format's own limit


def weight_files(hf_dir: str) -> list[str]:
  """The safetensors files of `hf_dir` (the shards of the index, or the single file)."""
  index = os.path.join(hf_dir, INDEX_FILE)
  if os.path.exists(index):
    try:
      with open(index) as f:
        shards = sorted(set(json.load(f).get('weight_map', {}).values()))
      if not all(isinstance(shard, str) for shard in shards):
        raise TypeError('a shard name is not a string')
    except (json.JSONDecodeError, AttributeError, TypeError) as e:
      raise ConversionError(f'{index}: not a valid index (a JSON object with a weight_map of '
                            f'tensor names to shard files): {e}') from None
    paths = [os.path.join(hf_dir, shard) for shard in shards]
    for path in paths:
      if not os.path.exists(path):
        raise ConversionError(f'{path}: shard listed in {INDEX_FILE} is missing')
    if not paths:
      raise ConversionError(f'{index}: weight_map lists no files')
    return paths
  single = os.path.join(hf_dir, SINGLE_FILE)
  if os.path.exists(single):
    return [single]
  found = sorted(n for n in os.listdir(hf_dir) if n.endswith('.safetensors'))
  if len(found) == 1:
    return [os.path.join(hf_dir, found[0])]
  raise ConversionError(f'{hf_dir}: no weights file ({SINGLE_FILE}, or {INDEX_FILE} and its '
                        f'shards); only safetensors checkpoints are read')


class SafetensorsFiles:
  """The tensors of a directory's safetensors files: names, shapes and dtypes from the
  headers, each tensor's data read when asked for (`read`)."""

  def __init__(self, hf_dir: str):
    # name -> (path, stored numpy dtype, shape, first byte, end byte), offsets in the file
    self._entries = {}
    for path in weight_files(hf_dir):
      for name, entry in _file_entries(path).items():
        self._entries[name] = entry

  def names(self) -> list[str]:
    return list(self._entries)

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def shape(self, name: str) -> tuple:
    return self._entries[name][2]

  def read(self, name: str, dtype=None) -> np.ndarray:
    """Tensor `name` as stored, or cast to the numpy `dtype` (a new array only then)."""
    path, stored, shape, start, end = self._entries[name]
    array = np.empty(shape, stored)
    if end > start:
      try:
        with open(path, 'rb') as f:
          f.seek(start)
          read = f.readinto(memoryview(array.reshape(-1).view(np.uint8)))
      except OSError as e:
        raise ConversionError(f'{path}: cannot read tensor {name!r}: {e}') from None
      if read != end - start:
        raise ConversionError(f'{path}: not a readable safetensors file (truncated or '
                              f'corrupt?): tensor {name!r} ends past the file')
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


def _file_entries(path: str) -> dict:
  """`{name: (path, dtype, shape, start, end)}` of one file's header, checked against the
  file's size; any fault is one `ConversionError` naming the file."""
  def corrupt(reason: str) -> ConversionError:
    return ConversionError(f'{path}: not a readable safetensors file (truncated or '
                           f'corrupt?): {reason}')
  size = os.path.getsize(path)
  with open(path, 'rb') as f:
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
      stored = np.dtype(STORED_DTYPES[entry['dtype']])
      shape = tuple(int(n) for n in entry['shape'])
      start, end = (int(n) for n in entry['data_offsets'])
    except (KeyError, TypeError, ValueError) as e:
      raise corrupt(f'tensor {name!r} has a bad entry {entry!r} ({type(e).__name__})') from None
    if end - start != int(np.prod(shape)) * stored.itemsize or start < 0:
      raise corrupt(f'tensor {name!r}: offsets {start}-{end} do not hold {shape} {stored}')
    if data_start + end > size:
      raise corrupt(f'tensor {name!r} ends at byte {data_start + end} of {size}')
    entries[name] = (path, stored, shape, data_start + start, data_start + end)
  return entries


def read_tensors(hf_dir: str, dtype: Optional[str] = 'float32',
                 names: Optional[Collection[str]] = None) -> dict[str, np.ndarray]:
  """Every tensor of `hf_dir`'s weights (or those in `names`) as numpy, cast to `dtype`
  (float32 | bfloat16; None: as stored)."""
  files = SafetensorsFiles(hf_dir)
  target = None if dtype is None else DTYPES[dtype]
  return {name: files.read(name, target) for name in files.names()
          if names is None or name in names}


class TensorSource:
  """The checkpoint's tensors, each read when taken by name with its expected shape."""

  def __init__(self, files: SafetensorsFiles, dtype: Optional[str] = None,
               ignored_suffixes: tuple = ()):
    """`dtype`: what `take` casts to (float32 | bfloat16; None: as stored)."""
    self._files = files
    self._dtype = None if dtype is None else DTYPES[dtype]
    self._used = set()
    self._ignored = tuple(ignored_suffixes)

  def has(self, name: str) -> bool:
    return name in self._files

  def take(self, name: str, shape: tuple) -> np.ndarray:
    """The tensor `name`, which must have `shape` (checked before it is read)."""
    if name not in self._files:
      raise ConversionError(f'missing tensor {name!r} (expected shape {tuple(shape)})')
    if tuple(self._files.shape(name)) != tuple(shape):
      raise ConversionError(f'tensor {name!r} has shape {tuple(self._files.shape(name))}; '
                            f'expected {tuple(shape)}')
    self._used.add(name)
    return self._files.read(name, self._dtype)

  def check_all_used(self) -> None:
    """Raises naming the first tensor nothing took (buffers in `ignored_suffixes` aside)."""
    unused = sorted(n for n in self._files.names()
                    if n not in self._used and not n.endswith(self._ignored))
    if unused:
      more = f' (and {len(unused) - 1} more)' if len(unused) > 1 else ''
      raise ConversionError(f'unexpected tensor {unused[0]!r}{more}: no parameter of the '
                            f'model reads it')


def torch_linear(source: TensorSource, name: str, out_shape: tuple, d_in: int,
                 bias: bool) -> dict:
  """A torch `Linear` (`name.weight [out, in]`, `name.bias [out]`) as a projection's
  `{kernel [in, *out_shape], bias [*out_shape]}`."""
  out = int(np.prod(out_shape))
  weight = source.take(f'{name}.weight', (out, d_in))
  params = {'kernel': weight.T.reshape(d_in, *out_shape)}
  if bias:
    params['bias'] = source.take(f'{name}.bias', (out,)).reshape(out_shape)
  return params


def torch_layer_norm(source: TensorSource, name: str, d: int, bias: bool = True) -> dict:
  """A torch LayerNorm (`name.weight [d]`, `name.bias [d]`) as a norm's `{scale, bias}`."""
  params = {'scale': source.take(f'{name}.weight', (d,))}
  if bias:
    params['bias'] = source.take(f'{name}.bias', (d,))
  return params

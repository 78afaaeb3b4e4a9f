"""Reading a Hugging Face directory's `*.safetensors` into numpy, tensor by tensor, and
checking each tensor.

One file (`model.safetensors`) or shards listed by `model.safetensors.index.json`.
The format itself (headers checked against each file's size, one tensor read
straight into its array) is `storage/safetensors_file.py`'s. `SafetensorsFiles`
reads every header once and then one tensor at a time, so an import holds the
tensors it has converted and one more, never the whole checkpoint twice.

`TensorSource.take(name, shape)` reads a tensor when the mapping asks for it,
checking its shape first; `TensorSource.check_all_used()` then names any tensor no
parameter took.
"""

import json
import os
from typing import Collection, Optional

import ml_dtypes
import numpy as np

from longformer_jax.convert.errors import ConversionError
from longformer_jax.storage import safetensors_file

INDEX_FILE = 'model.safetensors.index.json'
SINGLE_FILE = 'model.safetensors'
DTYPES = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}   # cast targets


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
  """The tensors of a directory's safetensors files: names and shapes from the headers,
  each tensor's data read when asked for (`read`)."""

  def __init__(self, hf_dir: str):
    self._entries = {}
    for path in weight_files(hf_dir):
      try:
        self._entries.update(safetensors_file.read_entries(path))
      except safetensors_file.SafetensorsError as e:
        raise ConversionError(str(e)) from None

  def names(self) -> list[str]:
    return list(self._entries)

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def shape(self, name: str) -> tuple:
    return self._entries[name].shape

  def read(self, name: str, dtype=None) -> np.ndarray:
    """Tensor `name` as stored, or cast to the numpy `dtype` (a new array only then)."""
    try:
      array = safetensors_file.read_tensor(self._entries[name], name)
    except safetensors_file.SafetensorsError as e:
      raise ConversionError(str(e)) from None
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


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

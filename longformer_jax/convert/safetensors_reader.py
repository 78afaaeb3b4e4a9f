"""Reading a Hugging Face directory's `*.safetensors` into numpy, and checking each tensor.

One file (`model.safetensors`) or shards listed by `model.safetensors.index.json`.
Tensors are read with the `safetensors` package (`safe_open(framework='np')`);
bfloat16 tensors, which numpy cannot name, are read from the file's own
layout (an 8-byte header length, a JSON header of dtype/shape/offsets, then the
data) as `ml_dtypes.bfloat16`. Nothing here imports torch.

`TensorSource.take(name, shape)` hands out a tensor once, checking its shape;
`TensorSource.check_all_used()` then names any tensor no parameter took.
"""

import json
import os
import struct
from typing import Collection, Optional

import ml_dtypes
import numpy as np
from safetensors import safe_open

from longformer_jax.convert.errors import ConversionError

INDEX_FILE = 'model.safetensors.index.json'
SINGLE_FILE = 'model.safetensors'
DTYPES = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}


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


def _raw_tensor(path: str, name: str) -> np.ndarray:
  """A bfloat16 tensor read from the file layout (numpy has no bfloat16 for safetensors)."""
  with open(path, 'rb') as f:
    (header_len,) = struct.unpack('<Q', f.read(8))
    entry = json.loads(f.read(header_len))[name]
    start, end = entry['data_offsets']
    f.seek(8 + header_len + start)
    data = f.read(end - start)
  return np.frombuffer(data, dtype=ml_dtypes.bfloat16).reshape(entry['shape']).copy()


def read_tensors(hf_dir: str, dtype: str = 'float32',
                 names: Optional[Collection[str]] = None) -> dict[str, np.ndarray]:
  """Every tensor of `hf_dir`'s weights (or those in `names`) as numpy, cast to `dtype`
  (float32 | bfloat16)."""
  target = DTYPES[dtype]
  tensors = {}
  for path in weight_files(hf_dir):
    try:
      tensors.update(_file_tensors(path, target, names))
    except ConversionError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      # SafetensorError (a truncated or corrupt file), struct/JSON errors of the raw reader.
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ConversionError(f'{path}: not a readable safetensors file (truncated or '
                            f'corrupt?): {reason}') from None
  return tensors


def _file_tensors(path: str, target, names=None) -> dict[str, np.ndarray]:
  tensors = {}
  with safe_open(path, framework='np') as f:
    for name in f.keys():
      if names is not None and name not in names:
        continue
      if f.get_slice(name).get_dtype() == 'BF16':
        tensor = _raw_tensor(path, name)
      else:
        tensor = f.get_tensor(name)
      tensors[name] = np.asarray(tensor).astype(target)
  return tensors


class TensorSource:
  """The checkpoint's tensors, each taken once by name with its expected shape."""

  def __init__(self, tensors: dict, ignored_suffixes: tuple = ()):
    self._tensors = dict(tensors)
    self._used = set()
    self._ignored = tuple(ignored_suffixes)

  def has(self, name: str) -> bool:
    return name in self._tensors

  def take(self, name: str, shape: tuple) -> np.ndarray:
    """The tensor `name`, which must have `shape`."""
    if name not in self._tensors:
      raise ConversionError(f'missing tensor {name!r} (expected shape {tuple(shape)})')
    tensor = self._tensors[name]
    if tuple(tensor.shape) != tuple(shape):
      raise ConversionError(f'tensor {name!r} has shape {tuple(tensor.shape)}; '
                            f'expected {tuple(shape)}')
    self._used.add(name)
    return tensor

  def check_all_used(self) -> None:
    """Raises naming the first tensor nothing took (buffers in `ignored_suffixes` aside)."""
    unused = sorted(n for n in self._tensors
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

"""A parameters-only checkpoint item as one safetensors file, written tensor by tensor.

An import (convert/workdir_cli.py) holds the checkpoint's parameters once, as numpy
arrays in the checkpoint's own dtypes. Orbax's array writer stages a second copy of
every array it writes (measured: a 2.47 GB parameter tree peaked at 6.5 GB and wrote
at about 60 MB/s), so this item is written by its own Orbax handler instead:
`params.safetensors` (the arrays one after another, each named by its path in the
tree, e.g. `blocks/layer_0/attention/query/kernel`) and `checksums.json` (each
tensor's CRC-32). Orbax still owns the step: its temporary directory, rename or commit
marker, and the `data` item beside this one.

Restoring reads each tensor as stored, checks its CRC-32, casts it to the target's
dtype and places it with the target's sharding, one tensor at a time.
"""

import dataclasses
import json
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from longformer_jax.checkpoint.resume_checks import CheckpointMismatchError, shape_differences
from longformer_jax.storage import safetensors_file

PyTree = Any
TENSORS_FILE = 'params.safetensors'
CHECKSUMS_FILE = 'checksums.json'


class CorruptParamsError(RuntimeError):
  """The item's files are missing, truncated or do not match their checksums."""


def tensor_name(path) -> str:
  """A leaf's name in the file: its dict keys joined by '/'."""
  return '/'.join(str(getattr(key, 'key', key)) for key in path)


class SafetensorsParamsHandler(ocp.CheckpointHandler):
  """Saves `ParamsSave` and restores `ParamsRestore` (module docstring)."""

  def save(self, directory: epath.Path, args: 'ParamsSave') -> None:
    if jax.process_index() != 0:
      return
    leaves = jax.tree_util.tree_leaves_with_path(args.params)
    tensors = [(tensor_name(path), np.asarray(leaf)) for path, leaf in leaves]
    checksums = safetensors_file.write_file(str(directory / TENSORS_FILE), tensors)
    (directory / CHECKSUMS_FILE).write_text(json.dumps(checksums, indent=0, sort_keys=True))

  def restore(self, directory: epath.Path, args: 'ParamsRestore') -> PyTree:
    try:
      entries = safetensors_file.read_entries(str(directory / TENSORS_FILE))
      checksums = json.loads((directory / CHECKSUMS_FILE).read_text())
    except (OSError, ValueError) as error:   # missing files, bad headers, bad JSON
      raise CorruptParamsError(f'{type(error).__name__}: {error}') from error
    targets = jax.tree_util.tree_leaves_with_path(args.target)
    wanted = {tensor_name(path): target for path, target in targets}
    differences = shape_differences(entries, wanted)
    if differences:
      raise CheckpointMismatchError('; '.join(differences[:5]))
    leaves = []
    for path, target in targets:
      name = tensor_name(path)
      try:
        stored = safetensors_file.read_tensor(entries[name], name)
      except ValueError as error:
        raise CorruptParamsError(str(error)) from error
      if safetensors_file.crc32(stored) != checksums.get(name):
        raise CorruptParamsError(f'tensor {name!r} differs from the checksum written with it')
      leaves.append(jax.device_put(stored.astype(target.dtype, copy=False),
                                   getattr(target, 'sharding', None)))
      del stored
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(args.target), leaves)


@ocp.args.register_with_handler(SafetensorsParamsHandler, for_save=True)
@dataclasses.dataclass
class ParamsSave(ocp.args.CheckpointArgs):
  """`params`: a tree of numpy (or host-addressable jax) arrays, saved in their dtypes."""
  params: PyTree


@ocp.args.register_with_handler(SafetensorsParamsHandler, for_restore=True)
@dataclasses.dataclass
class ParamsRestore(ocp.args.CheckpointArgs):
  """`target`: a tree of `jax.ShapeDtypeStruct`s (with shardings) to restore into."""
  target: PyTree

"""The device mesh `(data, fsdp, tensor)` built from `config.parallel`."""

from typing import Optional, Sequence

import jax
from jax.experimental import mesh_utils
import numpy as np

from longformer_jax.config.errors import ConfigError

MESH_AXES = ('data', 'fsdp', 'tensor')


def resolve_mesh_shape(mesh_shape: Sequence[int], device_count: int) -> tuple[int, ...]:
  """Fills at most one -1 so that the product equals `device_count`."""
  key = 'parallel.mesh_shape'
  shape = [int(s) for s in mesh_shape]
  if len(shape) != len(MESH_AXES):
    raise ConfigError(key, f'needs {len(MESH_AXES)} sizes for axes {MESH_AXES}, got {tuple(shape)}')
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ConfigError(key, f'sizes must be positive, with at most one -1; got {tuple(shape)}')
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if device_count % known:
      raise ConfigError(key, f'{tuple(shape)} cannot fill {device_count} devices')
    shape[shape.index(-1)] = device_count // known
  if int(np.prod(shape)) != device_count:
    raise ConfigError(key, f'{tuple(shape)} has {int(np.prod(shape))} devices but '
                      f'{device_count} are available ({jax.default_backend()})')
  return tuple(shape)


def make_mesh(mesh_shape: Sequence[int], devices: Optional[Sequence[jax.Device]] = None
              ) -> jax.sharding.Mesh:
  """A mesh over `devices` (all devices by default) with axes `MESH_AXES`.

  The device order follows the physical topology on TPU (neighbouring chips
  on the fastest-varying axes, as `mesh_utils.create_device_mesh` lays them
  out); on CPU it is the plain device order.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  device_grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  return jax.sharding.Mesh(device_grid, MESH_AXES)

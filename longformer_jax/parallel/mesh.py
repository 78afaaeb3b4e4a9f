"""The device mesh `(data, fsdp, tensor, sequence)` built from `config.parallel`.

`parallel.mesh_shape` gives 3 sizes `(data, fsdp, tensor)` (the `sequence`
axis is then 1) or 4 `(data, fsdp, tensor, sequence)`. Every mesh has all
four axes, so code can name `sequence` whatever the config; an axis of size
1 changes no sharding.
"""

from typing import Optional, Sequence

import jax
from jax.experimental import mesh_utils
import numpy as np

from longformer_jax.config.errors import ConfigError

MESH_AXES = ('data', 'fsdp', 'tensor', 'sequence')
SEQUENCE_AXIS = 'sequence'


def resolve_mesh_shape(mesh_shape: Sequence[int], device_count: int) -> tuple[int, ...]:
  """Fills at most one -1 so that the product equals `device_count`.

  Returns as many sizes as given: 3 `(data, fsdp, tensor)` or 4 (with
  `sequence`); `mesh_axis_sizes` always names all four.
  """
  key = 'parallel.mesh_shape'
  shape = [int(s) for s in mesh_shape]
  if len(shape) not in (len(MESH_AXES) - 1, len(MESH_AXES)):
    raise ConfigError(key, f'needs 3 or 4 sizes for axes {MESH_AXES} (sequence defaults to 1), '
                      f'got {tuple(shape)}')
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


def mesh_axis_sizes(mesh_shape: Sequence[int], device_count: int) -> dict[str, int]:
  """`{axis: size}` for all of `MESH_AXES` (`sequence` is 1 when `mesh_shape` has 3 sizes)."""
  shape = resolve_mesh_shape(mesh_shape, device_count)
  return dict(zip(MESH_AXES, shape + (1,) * (len(MESH_AXES) - len(shape))))


def make_mesh(mesh_shape: Sequence[int], devices: Optional[Sequence[jax.Device]] = None
              ) -> jax.sharding.Mesh:
  """A mesh over `devices` (all devices by default) with axes `MESH_AXES`.

  The device order follows the physical topology on TPU (neighbouring chips
  on the fastest-varying axes, `tensor` and `sequence`, as
  `mesh_utils.create_device_mesh` lays them out: ring neighbours are
  physical neighbours); on CPU it is the plain device order.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(mesh_axis_sizes(mesh_shape, len(devices)).values())
  device_grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  return jax.sharding.Mesh(device_grid, MESH_AXES)

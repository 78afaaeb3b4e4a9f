"""Placing the encoder tasks' batches on the mesh: every array split over its leading batch axis."""

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding

from longformer_jax.parallel import sharding


def batch_shardings(example_batch: dict, mesh: jax.sharding.Mesh, rules) -> dict:
  """`{name: NamedSharding}`: each array of `example_batch` sharded over its `batch` axis."""
  def spec(array):
    names = ('batch',) + (None,) * (np.ndim(array) - 1)
    return NamedSharding(mesh, nn.logical_to_mesh_axes(names, sharding.rules_tuple(rules)))
  return {name: spec(value) for name, value in example_batch.items()}


def to_global(local: dict, shardings: dict) -> dict:
  """This process's rows `{name: [rows, ...]}` -> global arrays laid out by `shardings`."""
  return {name: jax.make_array_from_process_local_data(shardings[name], value)
          for name, value in local.items()}

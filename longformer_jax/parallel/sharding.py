"""From logical axis names to `NamedSharding`s on a mesh.

Parameters and memory carry logical names (`batch`, `length`, `embed`,
`heads`, `head_dim`, `mlp`, `vocab`, `memory`, `layers`); the config's rules
map them to mesh axes. A mesh axis already used by an earlier dimension of
the same array is skipped, so one rule table serves parameters
(`embed -> fsdp`) and activations (`batch -> (data, fsdp)`, embed unsharded).
"""

import contextlib

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec

from longformer_jax.parallel import sequence_settings
from longformer_jax.parallel.parallel_config import length_on_sequence


def rules_tuple(rules) -> tuple:
  """Config rules (lists from the command line or tuples) as a tuple of pairs."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)


def box_with_logical_axes(tree, axes_tree):
  """Wraps each array leaf of `tree` in `nn.LogicallyPartitioned` with its names.

  `axes_tree` has `tree`'s structure with a tuple of names at each leaf.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  names = treedef.flatten_up_to(axes_tree)
  return treedef.unflatten([nn.LogicallyPartitioned(leaf, tuple(n)) for leaf, n in zip(leaves, names)])


def logical_shardings(abstract_boxed_tree, mesh: jax.sharding.Mesh, rules):
  """NamedShardings for a tree whose partitioned leaves are logically boxed."""
  specs = nn.get_partition_spec(abstract_boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules_tuple(rules))


def batch_sharding(mesh: jax.sharding.Mesh, rules) -> NamedSharding:
  """Sharding of `[batch, length]` input arrays."""
  spec = nn.logical_to_mesh_axes(('batch', 'length'), rules_tuple(rules))
  return NamedSharding(mesh, spec)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


@contextlib.contextmanager
def activation_sharding(mesh: jax.sharding.Mesh, rules, parallel=None):
  """Within it, `nn.with_logical_constraint` inside the model takes effect.

  With a `sequence` axis > 1 the `length` logical axis is sharded over it and
  the attention layers that can split a chunk do so, by the method of
  `parallel` (`config.parallel`; default ring with load balancing;
  parallel/sequence_settings.py).
  """
  if dict(mesh.shape).get(sequence_settings.SEQUENCE_AXIS, 1) > 1:
    rules = length_on_sequence(rules)
  settings = sequence_settings.SequenceSettings(
      method=parallel.sequence_parallel if parallel else 'ring',
      load_balance=parallel.load_balance if parallel else True)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules_tuple(rules)), \
      sequence_settings.using(settings):
    yield


def to_global_batch(local: dict, sharding: NamedSharding) -> dict:
  """Host-local numpy rows of this process -> global arrays sharded on the mesh."""
  return {name: jax.make_array_from_process_local_data(sharding, value)
          for name, value in local.items()}

"""A one-process run writes each replicated array whole (checkpoint/array_writes.py).

Orbax's default cuts an array replicated over n devices into n slices, one program
compiled per slice shape; here the state is replicated over the suite's 8 CPU devices.
(A train state of 55 arrays: 1.06 s -> 0.11 s for the first save of a process.)
"""

import contextlib
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from longformer_jax.checkpoint import array_writes
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.checkpoint.checksums import HOST_BYTES
from orbax.checkpoint._src.metadata import array_metadata_store


def replicated_state():
  """Arrays of several shapes (first axes 8-48, so Orbax can cut each in 8), on 8 devices."""
  assert jax.device_count() == 8
  sharding = NamedSharding(Mesh(np.array(jax.devices()), ('data',)), PartitionSpec())
  shapes = [(8, 4), (16, 3), (24,), (32, 2, 2), (40, 5), (48,)]
  state = {f'w{i}': jax.device_put(jnp.arange(np.prod(shape), dtype=jnp.float32)
                                   .reshape(shape) * (i + 1), sharding)
           for i, shape in enumerate(shapes)}
  assert sum(a.size * 4 for a in state.values()) <= HOST_BYTES    # checksums: no compile
  return state


def slices_of(function):
  """How many slices of device arrays `function()` cuts (Orbax's replica slices are
  `jax.lax.slice_in_dim` calls, each a program of its own shape)."""
  with mock.patch('jax.lax.slice_in_dim', wraps=jax.lax.slice_in_dim) as slicing:
    function()
  return slicing.call_count


def save(directory, state):
  checkpointer = Checkpointer(str(directory), keep=2, async_save=False)
  checkpointer.save(1, state, {'step': 1})
  checkpointer.wait()
  checkpointer.close()


@contextlib.contextmanager
def orbax_default_writes():
  """Orbax's own `jax.Array` handler (replica-parallel) inside the block; the project's
  handler is registered again at the next `Checkpointer` after it."""
  default = lambda: ocp.type_handlers.ArrayHandler(
      array_metadata_store=array_metadata_store.Store())
  with mock.patch('longformer_jax.checkpoint.checkpointer.use_whole_array_writes', lambda: None):
    ocp.type_handlers.register_type_handler(jax.Array, default(), override=True)
    try:
      yield
    finally:
      array_writes._registered = False       # pylint: disable=protected-access


def test_a_replicated_state_is_saved_without_slicing(tmp_path):
  state = replicated_state()
  assert slices_of(lambda: save(tmp_path / 'whole', state)) == 0


def test_orbax_default_cuts_each_array_in_one_slice_per_device(tmp_path):
  """What the test above would count with Orbax's default: 8 slices of each array."""
  state = replicated_state()
  with orbax_default_writes():
    assert slices_of(lambda: save(tmp_path / 'sliced', state)) == 8 * len(state)


def test_checkpoints_written_either_way_restore_to_the_same_arrays(tmp_path):
  state = replicated_state()
  abstract = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
  with orbax_default_writes():
    save(tmp_path / 'sliced', state)
  save(tmp_path / 'whole', state)
  for name in ('sliced', 'whole'):
    checkpointer = Checkpointer(str(tmp_path / name), keep=2, async_save=False)
    restored, data = checkpointer.restore(1, abstract)
    checkpointer.close()
    assert data == {'step': 1}
    for key, array in state.items():
      np.testing.assert_array_equal(np.asarray(restored[key]), np.asarray(array), err_msg=name)

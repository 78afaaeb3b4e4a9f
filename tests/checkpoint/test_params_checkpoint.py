"""Parameters-only checkpoints (an import's) and reading the parameters of a whole train
state without its optimizer state (`Checkpointer.save_params`, `restore_params`,
`restore_latest_intact(from_params=...)`)."""

import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from longformer_jax.checkpoint.checkpointer import (Checkpointer, CheckpointMismatchError,
                                                    CorruptCheckpointError,
                                                    NoIntactCheckpointError)
from longformer_jax.checkpoint import saved_layout
from longformer_jax.storage import safetensors_file
from longformer_jax.train.train_state import TrainState

pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


def stored_params() -> dict:
  """numpy leaves as an import holds them: bfloat16 and float32, one of them a view."""
  rng = np.random.default_rng(0)
  table = rng.normal(size=(48, 16)).astype(ml_dtypes.bfloat16)
  return {'embedding': {'embedding': table, 'output': {'kernel': table.T}},
          'final_norm': {'scale': np.linspace(0.5, 1.5, 16, dtype=np.float32)}}


def abstract_of(tree, dtype=jnp.float32, shapes=None) -> dict:
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(shapes or x.shape, dtype, sharding=one), tree)


def whole_state(params, abstract_params) -> TrainState:
  """A train state around `params`, its optimizer moments twice the parameters."""
  del abstract_params
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
  moments = jax.tree_util.tree_map(lambda x: x * 3.0, params)
  return TrainState(step=jnp.int32(5), params=params, opt_state=(moments, moments),
                    memory=(), rng=jax.random.PRNGKey(1), model_state={})


def abstract_state(state: TrainState) -> TrainState:
  """`state`'s shapes and dtypes with its shardings (what a restore is given)."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def largest_file(step_dir: pathlib.Path) -> pathlib.Path:
  return max((p for p in step_dir.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)


def test_params_only_checkpoint_keeps_the_stored_dtypes_and_restores_cast(tmp_path):
  params = stored_params()
  expected = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
  with Checkpointer(str(tmp_path), keep=2, async_save=False) as checkpointer:
    assert checkpointer.save_params(0, params, {'step': 0})
    assert checkpointer.holds_params_only(0)
    entries = safetensors_file.read_entries(
        str(tmp_path / 'checkpoints' / '0' / 'params' / 'params.safetensors'))
    assert entries['embedding/embedding'].dtype == ml_dtypes.bfloat16   # as the file had it
    assert entries['final_norm/scale'].dtype == np.float32
    state = whole_state(params, None)
    abstract = abstract_state(state)
    restored, model_state, step = checkpointer.restore_params(None, abstract)
    assert step == 0 and model_state == {}
    jax.tree_util.tree_map(lambda r, e: np.testing.assert_array_equal(np.asarray(r), e),
                           restored, expected)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(restored))
    built, data_state, step = checkpointer.restore_latest_intact(
        abstract, from_params=lambda p: ('built from', p))
    assert built[0] == 'built from' and data_state == {'step': 0} and step == 0
    jax.tree_util.tree_map(lambda r, e: np.testing.assert_array_equal(np.asarray(r), e),
                           built[1], expected)
    with pytest.raises(CheckpointMismatchError, match='holds parameters only'):
      checkpointer.restore_latest_intact(abstract)       # a run that cannot start from it


def test_a_flipped_bit_in_a_params_only_checkpoint_is_corruption(tmp_path):
  """Each tensor's CRC-32 is checked on the bytes read, before the cast."""
  with Checkpointer(str(tmp_path), keep=2, async_save=False) as checkpointer:
    checkpointer.save_params(0, stored_params(), {'step': 0})
  path = largest_file(tmp_path / 'checkpoints' / '0' / 'params')
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x01
  path.write_bytes(bytes(data))
  abstract = abstract_state(whole_state(stored_params(), None))
  with Checkpointer(str(tmp_path), keep=2, async_save=False) as checkpointer:
    with pytest.raises(CorruptCheckpointError, match='step 0'):
      checkpointer.restore_params(0, abstract)
    with pytest.raises(NoIntactCheckpointError):
      checkpointer.restore_latest_intact(abstract, from_params=lambda p: p)
  assert (tmp_path / 'checkpoints' / '0.corrupt').is_dir()


def test_params_of_other_shapes_are_a_mismatch(tmp_path):
  with Checkpointer(str(tmp_path), keep=2, async_save=False) as checkpointer:
    checkpointer.save_params(0, {'w': np.ones((4, 3), np.float32)}, {'step': 0})
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32),
                          params=abstract_of({'w': 0}, shapes=(4, 5)), opt_state=(),
                          memory=(), rng=jax.ShapeDtypeStruct((2,), jnp.uint32), model_state={})
    with pytest.raises(CheckpointMismatchError, match='w'):
      checkpointer.restore_params(0, abstract)
  assert (tmp_path / 'checkpoints' / '0').is_dir()        # nothing moved


def test_a_whole_state_gives_its_parameters_without_reading_the_moments(tmp_path):
  """`restore_params` of a train state reads the step and parameters, checked against their
  checksums; the optimizer state is not read: a target whose moments have other shapes than
  saved restores all the same, where `restore` refuses it."""
  state = whole_state(stored_params(), None)
  with Checkpointer(str(tmp_path), keep=2, async_save=False) as checkpointer:
    checkpointer.save(5, state, {'step': 5})
    assert not checkpointer.holds_params_only(5)
    abstract = abstract_state(state)
    other_moments = abstract.replace(opt_state=abstract_of((0, 0), shapes=(7,)))
    with pytest.raises(CheckpointMismatchError):
      checkpointer.restore(5, other_moments)
    params, model_state, step = checkpointer.restore_params(5, other_moments)
  assert step == 5 and model_state == {}
  jax.tree_util.tree_map(lambda r, e: np.testing.assert_array_equal(np.asarray(r), np.asarray(e)),
                         params, state.params)


def test_a_flipped_parameter_of_a_whole_state_is_caught_by_restore_params(tmp_path,
                                                                          monkeypatch):
  """The parameters' checksums are those saved with the whole state (paths `.params...`)."""
  state = whole_state(stored_params(), None)
  with Checkpointer(str(tmp_path), keep=2, async_save=False) as checkpointer:
    checkpointer.save(5, state, {'step': 5})
    abstract = abstract_state(state)
    real_read = saved_layout.read_fields

    def flipped(state_directory, target):
      fields = real_read(state_directory, target)
      scale = fields['params']['final_norm']['scale']
      fields['params']['final_norm']['scale'] = scale.at[3].set(scale[3] + 1.0)
      return fields
    monkeypatch.setattr(saved_layout, 'read_fields', flipped)
    with pytest.raises(CorruptCheckpointError, match=r"final_norm.*scale"):
      checkpointer.restore_params(5, abstract)


def test_safetensors_file_round_trip_with_views_and_crcs(tmp_path):
  """`write_file` writes views and every stored dtype the reader names; `read_tensor` gives
  the same arrays back; the CRC-32 it returns is that of the bytes read."""
  base = np.arange(24, dtype=np.float32).reshape(4, 6)
  tensors = [('a/transposed', base.T), ('b', base.astype(ml_dtypes.bfloat16)),
             ('c', np.array([True, False])), ('empty', np.zeros((0, 3), np.float16))]
  path = str(tmp_path / 'x.safetensors')
  crcs = safetensors_file.write_file(path, tensors)
  entries = safetensors_file.read_entries(path)
  assert list(entries) == [name for name, _ in tensors]
  for name, array in tensors:
    read = safetensors_file.read_tensor(entries[name], name)
    assert read.dtype == array.dtype and read.shape == array.shape
    np.testing.assert_array_equal(read, array)
    assert safetensors_file.crc32(read) == crcs[name]
  # The format as the `safetensors` package (an independent implementation) reads and
  # writes it: it reads what write_file wrote, and read_tensor reads what it writes.
  plain = {name: np.ascontiguousarray(array) for name, array in tensors
           if array.dtype != ml_dtypes.bfloat16}
  for name, array in safetensors_numpy.load_file(path).items():
    if name in plain:
      np.testing.assert_array_equal(array, plain[name])
  reference = str(tmp_path / 'reference.safetensors')
  safetensors_numpy.save_file(plain, reference)
  for name, entry in safetensors_file.read_entries(reference).items():
    np.testing.assert_array_equal(safetensors_file.read_tensor(entry, name), plain[name])
  with open(path, 'r+b') as f:                       # cut the last tensor's bytes
    f.truncate(entries['c'].end - 1)
  with pytest.raises(safetensors_file.SafetensorsError, match='ends at byte'):
    safetensors_file.read_entries(path)

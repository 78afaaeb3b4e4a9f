"""Tests for `longformer_jax.checkpoint.checkpointer`.

They run on CPU with one or more (forced host platform) devices; the sharding
tests need at least two.
"""

import logging
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from longformer_jax.checkpoint import checkpointer
from longformer_jax.checkpoint import checksums
from longformer_jax.checkpoint.checkpointer import (
    Checkpointer,
    CheckpointNotFoundError,
)
from tests.support.checkpoint_states import (TinyTrainState, abstract_like, assert_bit_identical,
                                             bits_of, make_state)

needs_two_devices = pytest.mark.skipif(
    jax.device_count() < 2, reason='needs at least two devices'
)


@pytest.fixture
def workdir(tmp_path):
  return str(tmp_path / 'run')


@pytest.mark.parametrize('async_save', [False, True])
def test_round_trip_is_bit_identical(workdir, async_save):
  state = make_state()
  with Checkpointer(workdir, keep=3, async_save=async_save) as ckpt:
    assert ckpt.save(10, state, {'epoch': 1, 'position': 123})
    ckpt.wait()
    restored, data = ckpt.restore(10, abstract_like(state))
  assert_bit_identical(state, restored)
  assert isinstance(restored, TinyTrainState)
  assert data == {'epoch': 1, 'position': 123}


def test_data_state_round_trip_keeps_nested_json(workdir):
  data = {'shard': 3, 'offset': 2**40, 'files': ['a', 'b'], 'seed': None,
          'nested': {'rate': 0.5}}
  with Checkpointer(workdir, keep=1, async_save=False) as ckpt:
    ckpt.save(1, make_state(), data)
    _, restored = ckpt.restore(1, abstract_like(make_state()))
  assert restored == data


def test_async_save_survives_deleting_the_arrays(workdir):
  """The trainer donates the state right after `save` returns."""
  state = make_state(seed=2)
  expected = jax.tree.map(np.asarray, jax.tree.map(bits_of, state))
  abstract = abstract_like(state)
  with Checkpointer(workdir, keep=2, async_save=True) as ckpt:
    ckpt.save(5, state, {'position': 5})
    for leaf in jax.tree.leaves(state):
      leaf.delete()
    ckpt.wait()
    restored, _ = ckpt.restore(5, abstract)
  for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(bits_of(got), want)


def test_back_to_back_async_saves_all_land(workdir):
  with Checkpointer(workdir, keep=5, async_save=True) as ckpt:
    for step in (1, 2, 3):
      assert ckpt.save(step, make_state(step), {'position': step})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2, 3]
    for step in (1, 2, 3):
      restored, data = ckpt.restore(step, abstract_like(make_state()))
      assert_bit_identical(make_state(step), restored)
      assert data == {'position': step}


def test_keeps_only_the_last_n(workdir):
  with Checkpointer(workdir, keep=2, async_save=True) as ckpt:
    for step in (10, 20, 30, 40):
      ckpt.save(step, make_state(), {})
    ckpt.wait()
    assert ckpt.all_steps() == [30, 40]
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == [
      '30', '40'
  ]


def test_latest_step_and_reopening(workdir):
  with Checkpointer(workdir, keep=3, async_save=True) as ckpt:
    assert ckpt.latest_step() is None
    assert ckpt.all_steps() == []
    ckpt.save(3, make_state(), {'position': 3})
    ckpt.save(8, make_state(1), {'position': 8})
    assert ckpt.latest_step() == 8
  with Checkpointer(workdir, keep=3) as reopened:
    assert reopened.all_steps() == [3, 8]
    assert reopened.latest_step() == 8
    restored, data = reopened.restore(None, abstract_like(make_state()))
  assert_bit_identical(make_state(1), restored)
  assert data == {'position': 8}


@pytest.mark.parametrize('async_save', [False, True])
def test_saving_a_step_twice_is_skipped(workdir, async_save):
  with Checkpointer(workdir, keep=3, async_save=async_save) as ckpt:
    assert ckpt.save(4, make_state(0), {'position': 0})
    assert not ckpt.save(4, make_state(1), {'position': 1})
    assert not ckpt.save(4, make_state(1), {'position': 1}, force=True)
    assert not ckpt.save(3, make_state(1), {'position': 1})
    restored, data = ckpt.restore(4, abstract_like(make_state()))
  assert_bit_identical(make_state(0), restored)
  assert data == {'position': 0}


def test_missing_step_error_lists_available_steps(workdir):
  with Checkpointer(workdir, keep=3, async_save=False) as ckpt:
    with pytest.raises(CheckpointNotFoundError, match='No checkpoints'):
      ckpt.restore(None, abstract_like(make_state()))
    ckpt.save(2, make_state(), {})
    ckpt.save(6, make_state(), {})
    with pytest.raises(CheckpointNotFoundError, match=r'5.*\[2, 6\]'):
      ckpt.restore(5, abstract_like(make_state()))


def test_saving_an_existing_step_again_says_nothing(workdir, caplog):
  """The loop saves at its end even when that step was just saved."""
  with caplog.at_level(logging.INFO):
    with Checkpointer(workdir, keep=3, async_save=True) as ckpt:
      assert ckpt.save(1, make_state(), {})
      ckpt.wait()
      restored, data = ckpt.restore(1, abstract_like(make_state()))
      assert not ckpt.save(1, restored, data)
      assert ckpt.save(2, restored, data)
      assert not ckpt.save(2, restored, data)
  messages = [r.getMessage() for r in caplog.records]
  assert not [m for m in messages if 'already exist' in m.lower()], messages


def test_leftover_temporary_directory_is_ignored(workdir):
  with Checkpointer(workdir, keep=3, async_save=False) as ckpt:
    ckpt.save(3, make_state(3), {'position': 3})
  leftover = pathlib.Path(workdir) / 'checkpoints' / '7.orbax-checkpoint-tmp'
  (leftover / 'state').mkdir(parents=True)
  (leftover / 'state' / 'manifest.ocdbt').write_bytes(b'half written')

  with Checkpointer(workdir, keep=3, async_save=True) as ckpt:
    assert ckpt.all_steps() == [3]
    restored, _ = ckpt.restore(None, abstract_like(make_state()))
    assert_bit_identical(make_state(3), restored)
    assert ckpt.save(7, make_state(7), {'position': 7})
    ckpt.wait()
    restored, data = ckpt.restore(7, abstract_like(make_state()))
  assert_bit_identical(make_state(7), restored)
  assert data == {'position': 7}


def test_restore_into_another_dtype_is_not_reported_as_corrupt(workdir):
  state = make_state()
  abstract = abstract_like(state)
  abstract.params['dense']['kernel'] = jax.ShapeDtypeStruct(
      (64, 64), jnp.bfloat16, sharding=state.params['dense']['kernel'].sharding)
  with Checkpointer(workdir, keep=1, async_save=False) as ckpt:
    ckpt.save(1, state, {})
    restored, _ = ckpt.restore(1, abstract)
  kernel = restored.params['dense']['kernel']
  assert kernel.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      np.asarray(kernel),
      np.asarray(state.params['dense']['kernel'].astype(jnp.bfloat16)))


def test_keep_must_be_positive(workdir):
  with pytest.raises(ValueError, match='keep'):
    Checkpointer(workdir, keep=0)


def test_checksum_changes_with_any_single_element():
  state = {'w': jnp.zeros((16, 8), jnp.bfloat16), 'k': jax.random.key(0)}
  base = checksums.state_checksums(state)
  changed_w = dict(state, w=state['w'].at[15, 7].set(1e-3))
  changed_k = dict(state, k=jax.random.key(1))
  assert checksums.state_checksums(changed_w)["['w']"] != base["['w']"]
  assert checksums.state_checksums(changed_w)["['k']"] == base["['k']"]
  assert checksums.state_checksums(changed_k)["['k']"] != base["['k']"]
  assert base["['k']"]['dtype'] == 'key<fry>'


def _two_device_mesh() -> Mesh:
  return Mesh(np.array(jax.devices()[:2]), ('data',))


@needs_two_devices
def test_sharded_state_restores_with_the_same_sharding(workdir):
  mesh = _two_device_mesh()
  row_sharded = NamedSharding(mesh, PartitionSpec('data', None))
  replicated = NamedSharding(mesh, PartitionSpec())
  state = jax.device_put(make_state(4), replicated)
  state = state.replace(params=dict(
      state.params,
      dense=dict(
          state.params['dense'],
          kernel=jax.device_put(state.params['dense']['kernel'], row_sharded),
      ),
  ))
  with Checkpointer(workdir, keep=1, async_save=True) as ckpt:
    ckpt.save(1, state, {})
    ckpt.wait()
    restored, _ = ckpt.restore(1, abstract_like(state))
  assert_bit_identical(state, restored)
  assert restored.params['dense']['kernel'].sharding == row_sharded


@needs_two_devices
def test_restore_into_a_different_sharding(workdir):
  state = make_state(5)
  column_sharded = NamedSharding(_two_device_mesh(),
                                 PartitionSpec(None, 'data'))
  abstract = abstract_like(state)
  abstract.params['dense']['kernel'] = jax.ShapeDtypeStruct(
      (64, 64), jnp.float32, sharding=column_sharded)
  with Checkpointer(workdir, keep=1, async_save=False) as ckpt:
    ckpt.save(1, state, {})
    restored, _ = ckpt.restore(1, abstract)
  kernel = restored.params['dense']['kernel']
  assert kernel.sharding == column_sharded
  np.testing.assert_array_equal(bits_of(kernel),
                                bits_of(state.params['dense']['kernel']))


def test_zero_size_arrays_round_trip(tmp_path):
  """A memory of capacity 0 (mem_len=0) is part of the state; Orbax alone refuses it."""
  state = {'w': jnp.arange(4, dtype=jnp.float32), 'memory': jnp.zeros((2, 3, 0, 8), jnp.bfloat16),
           'valid': jnp.zeros((2, 0), bool)}
  with checkpointer.Checkpointer(str(tmp_path), keep=2, async_save=False) as ckpt:
    assert ckpt.save(1, state, {'step': 1})
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored, data = ckpt.restore(None, abstract)
  assert data == {'step': 1}
  for name, value in state.items():
    assert restored[name].shape == value.shape and restored[name].dtype == value.dtype
  np.testing.assert_array_equal(np.asarray(restored['w']), np.asarray(state['w']))


def test_host_checksums_equal_the_device_program():
  """Small states are hashed with numpy (no compile); the values equal the device program's,
  so checkpoints written either way verify either way."""
  rng = np.random.default_rng(0)
  state = {'f32': jnp.asarray(rng.normal(size=(3, 5)), jnp.float32),
           'bf16': jnp.asarray(rng.normal(size=(7,)), jnp.bfloat16),
           'i32': jnp.asarray(rng.integers(-9, 9, size=(2, 2, 3)), jnp.int32),
           'u8': jnp.asarray(rng.integers(0, 255, size=(11,)), jnp.uint8),
           'mask': jnp.asarray(rng.integers(0, 2, size=(4,)), bool),
           'key': jax.random.key(3), 'raw_key': jax.random.PRNGKey(4),
           'same_shape': [jnp.asarray(rng.normal(size=(3, 5)), jnp.float32) for _ in range(2)],
           'scalar': jnp.zeros((), jnp.int32)}
  arrays = jax.tree_util.tree_leaves(state)
  host = [checksums._host_lanes(a) for a in arrays]
  device = [tuple(int(v) for v in pair)
            for pair in checksums._all_checksum_lanes(arrays)]
  assert host == device

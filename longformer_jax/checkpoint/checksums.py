"""Sharding-independent checksums of a train state, stored beside each checkpoint.

orbax detects missing and truncated files but restores a flipped bit inside an
array's data silently; the checkpointer saves these checksums with every
checkpoint and compares them after a restore.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
HOST_BYTES = 64 * 2**20   # states up to this size are hashed with numpy (no XLA compile)


def state_checksums(state: PyTree, prefix: str = '') -> dict[str, dict]:
  """Returns `{prefix + leaf path: {dtype, shape, checksum}}` for the arrays of `state`.

  The checksum is a 64-bit position-dependent hash of the array's bits,
  computed on the devices that hold the array (so it works for arrays sharded
  across hosts) and independent of the sharding; a small state held by this
  process (at most `HOST_BYTES`) is hashed with numpy instead, the same values
  without compiling a program. `prefix`: prepended to every path (`.params`
  names a train state's parameters).
  """
  leaves = [
      (path, leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf))
      for path, leaf in jax.tree_util.tree_leaves_with_path(state)
  ]
  arrays = [leaf for _, leaf in leaves]
  if (all(a.is_fully_addressable for a in arrays)
      and sum(a.size * a.dtype.itemsize for a in arrays) <= HOST_BYTES):
    lanes = [_host_lanes(a) for a in arrays]        # small: no compile
  else:
    lanes = _all_checksum_lanes(arrays)
  return {
      prefix + jax.tree_util.keystr(path): {
          'dtype': str(leaf.dtype),
          'shape': list(leaf.shape),
          'checksum': ''.join(f'{_scalar_value(lane):08x}' for lane in pair),
      }
      for (path, leaf), pair in zip(leaves, lanes)
  }


def checksum_mismatches(restored: dict[str, dict], saved: dict[str, dict]) -> list[str]:
  """Paths of `restored` (`state_checksums` of what was read) whose checksum differs from
  `saved` (written with the checkpoint) or that `saved` lacks. A leaf restored into another
  dtype or shape than it was saved with (a deliberate conversion) cannot match and is
  skipped."""
  def comparable(record, other):
    return other is not None and all(record[key] == other[key] for key in ('dtype', 'shape'))
  bad = [path for path, record in restored.items()
         if comparable(record, saved.get(path)) and record != saved[path]]
  return bad + sorted(set(restored) - set(saved))


def _scalar_value(value) -> int:
  """Reads a replicated scalar, also when it spans several hosts."""
  if isinstance(value, (int, np.integer)):
    return int(value)
  return int(np.asarray(value.addressable_shards[0].data))


def _host_fmix32(h: np.ndarray) -> np.ndarray:
  h = h ^ (h >> np.uint32(16))
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> np.uint32(13))
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> np.uint32(16))


def _host_lanes(x: jax.Array) -> tuple[int, int]:
  """`_checksum_lanes` computed with numpy on the host (the same bits, the same sums)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  host = np.ascontiguousarray(np.asarray(x))
  if host.dtype == np.bool_:
    words = host.astype(np.uint32).reshape(-1)
  else:
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}
    if host.dtype.itemsize not in unsigned:
      raise TypeError(f'Cannot checksum arrays of dtype {host.dtype}.')
    words = host.reshape(-1).view(unsigned[host.dtype.itemsize]).astype(np.uint32)
  index = (np.arange(words.size, dtype=np.uint64) % 2**32).astype(np.uint32)
  lane_a = _host_fmix32(words + index * np.uint32(0x9E3779B9))
  lane_b = _host_fmix32(words ^ _host_fmix32(index + np.uint32(0x7F4A7C15)))
  return int(np.sum(lane_a, dtype=np.uint32)), int(np.sum(lane_b, dtype=np.uint32))


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer: a bijection on uint32 that mixes bits."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _as_uint32_words(x: jax.Array) -> jax.Array:
  """The bits of `x` as uint32 (8-byte elements become two words)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}
  if x.dtype.itemsize not in unsigned:
    raise TypeError(f'Cannot checksum arrays of dtype {x.dtype}.')
  words = jax.lax.bitcast_convert_type(x, unsigned[x.dtype.itemsize])
  return words.astype(jnp.uint32)


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
  """Row-major position of each element (mod 2**32), without a reshape."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
    index = index + iota * jnp.uint32(stride % 2**32)
    stride *= shape[axis]
  return index


def _all_checksum_lanes(leaves: list) -> list:
  """`_checksum_lanes` of every leaf, one compiled program per distinct shape and dtype,
  called leaf by leaf (a train state repeats its shapes: layers, optimizer moments), so
  the temporaries are one leaf's. (One program over the state with leaves of a shape
  stacked asked for 33 GB of temporaries for the train state of a 1.2B-parameter model.)"""
  return [_leaf_checksum_lanes(x) for x in leaves]


def _checksum_lanes(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Two independent 32-bit sums of per-element hashes of `x`.

  Each element's hash is a bijection of its bits, so changing any single
  element always changes both sums; integer sums wrap exactly, so the result
  does not depend on the reduction order or on the sharding.
  """
  words = _as_uint32_words(x)
  index = _flat_index(words.shape)
  lane_a = _fmix32(words + index * jnp.uint32(0x9E3779B9))
  lane_b = _fmix32(words ^ _fmix32(index + jnp.uint32(0x7F4A7C15)))
  return jnp.sum(lane_a, dtype=jnp.uint32), jnp.sum(lane_b, dtype=jnp.uint32)


_leaf_checksum_lanes = jax.jit(_checksum_lanes)   # one compile per shape and dtype

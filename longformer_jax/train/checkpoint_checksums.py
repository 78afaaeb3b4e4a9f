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


def state_checksums(state: PyTree) -> dict[str, dict]:
  """Returns `{leaf path: {dtype, shape, checksum}}` for the arrays of `state`.

  The checksum is a 64-bit position-dependent hash of the array's bits,
  computed on the devices that hold the array (so it works for arrays sharded
  across hosts) and independent of the sharding.
  """
  leaves = [
      (path, leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf))
      for path, leaf in jax.tree_util.tree_leaves_with_path(state)
  ]
  lanes = [_checksum_lanes(leaf) for _, leaf in leaves]  # Dispatch all first.
  return {
      jax.tree_util.keystr(path): {
          'dtype': str(leaf.dtype),
          'shape': list(leaf.shape),
          'checksum': ''.join(f'{_scalar_value(lane):08x}' for lane in pair),
      }
      for (path, leaf), pair in zip(leaves, lanes)
  }


def _scalar_value(value: jax.Array) -> int:
  """Reads a replicated scalar, also when it spans several hosts."""
  return int(np.asarray(value.addressable_shards[0].data))


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


@jax.jit
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

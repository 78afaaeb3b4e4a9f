"""A small train state with every dtype and key flavour the trainer uses, its abstract form,
bit-for-bit comparison and the digests of a checkpoint's files."""

import hashlib
import pathlib

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class TinyTrainState:
  step: jax.Array
  params: dict
  rng: jax.Array


def make_state(seed: int = 0) -> TinyTrainState:
  """A small state with every dtype and key flavour the trainer uses."""
  key = jax.random.key(seed)
  return TinyTrainState(
      step=jnp.int32(seed + 7),
      params={
          'dense': {
              'kernel': jax.random.normal(key, (64, 64), jnp.float32),
              'bias': jnp.linspace(-1.0, 1.0, 64, dtype=jnp.bfloat16),
          },
          'counts': jnp.arange(5, dtype=jnp.int32) * (seed + 1),
          'raw_key': jax.random.PRNGKey(seed),  # uint32[2]
      },
      rng=jax.random.key(seed + 1),  # typed key<fry>
  )


def abstract_like(state):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      state,
  )


def bits_of(x) -> np.ndarray:
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return np.asarray(x).reshape(-1).view(np.uint8)


def assert_bit_identical(expected, actual):
  assert jax.tree.structure(expected) == jax.tree.structure(actual)
  for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(actual)):
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.sharding == want.sharding
    np.testing.assert_array_equal(bits_of(got), bits_of(want))


def file_digests(directory) -> dict[str, str]:
  return {
      str(path.relative_to(directory)): hashlib.sha256(
          path.read_bytes()
      ).hexdigest()
      for path in sorted(pathlib.Path(directory).rglob('*'))
      if path.is_file()
  }

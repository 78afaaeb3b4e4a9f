"""The zigzag layout that balances causal attention over the sequence axis.

Split contiguously, a causal chunk gives device 0 the first slice (its
queries see one block of keys) and device n-1 the last (n blocks): the ring
waits for the slowest device. The zigzag cuts the chunk into 2n slices and
gives device i slices i and 2n-1-i, an early and a late one, so every
device has the same number of unmasked (query, key) pairs (the layout of
Llama 3's context parallelism, Dubey et al., 2024, sec. 3.3.2). Masks
compare absolute positions (docs/design.md, contract 2), so attention is
correct in any layout; only the positions must travel with the tokens.

Arrays are permuted along their length axis; `[batch, chunk, ...]` in the
natural order becomes `[batch, chunk, ...]` in device order (device i's
shard is the i-th contiguous block of chunk / n), and back.
"""

import jax
import jax.numpy as jnp
import numpy as np


def zigzag_order(length: int, num_devices: int) -> np.ndarray:
  """Indices `[length]`: position j of the zigzag layout holds token `order[j]`.

  Device i's contiguous block is slices i and 2n-1-i (each length / 2n).
  """
  slices = 2 * num_devices
  if length % slices:
    raise ValueError(f'length {length} is not divisible by 2 x {num_devices} devices')
  size = length // slices
  per_device = [np.concatenate([np.arange(i * size, (i + 1) * size),
                                np.arange((slices - 1 - i) * size, (slices - i) * size)])
                for i in range(num_devices)]
  return np.concatenate(per_device)


def to_zigzag(x: jax.Array, num_devices: int, axis: int = 1) -> jax.Array:
  """`x` with its `axis` (the length) permuted from natural order into the zigzag layout."""
  return jnp.take(x, zigzag_order(x.shape[axis], num_devices), axis=axis)


def from_zigzag(x: jax.Array, num_devices: int, axis: int = 1) -> jax.Array:
  """Inverse of `to_zigzag`."""
  inverse = np.argsort(zigzag_order(x.shape[axis], num_devices))
  return jnp.take(x, inverse, axis=axis)

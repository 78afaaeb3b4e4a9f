"""The chunk driver: `jax.lax.scan` over the chunks of a long input.

The carry is every layer's memory; one chunk's computation sees the memory
left by the previous chunk (docs/design.md, contract 4). Backpropagation runs
through the scan; memory contents are stop-gradient inside the variants.
"""

from typing import Callable

import jax
import jax.numpy as jnp


def split_into_chunks(array: jax.Array, chunk_len: int) -> jax.Array:
  """`[batch, n * chunk_len, ...] -> [n, batch, chunk_len, ...]`."""
  batch, total = array.shape[:2]
  if total % chunk_len:
    raise ValueError(f'length {total} is not a multiple of chunk_len {chunk_len}')
  chunks = array.reshape(batch, total // chunk_len, chunk_len, *array.shape[2:])
  return jnp.swapaxes(chunks, 0, 1)


def merge_chunks(array: jax.Array) -> jax.Array:
  """Inverse of `split_into_chunks`: `[n, batch, chunk_len, ...] -> [batch, n * chunk_len, ...]`."""
  n, batch, chunk_len = array.shape[:3]
  return jnp.swapaxes(array, 0, 1).reshape(batch, n * chunk_len, *array.shape[3:])


def scan_chunks(chunk_fn: Callable, states, inputs: dict, chunk_len: int):
  """Runs `chunk_fn` over consecutive chunks, carrying `states`.

  Args:
    chunk_fn: `(states, chunk: dict, chunk_index) -> (states, outputs)`; each
      value of `chunk` is the `[batch, chunk_len, ...]` slice of `inputs`.
    states: the memory pytree carried from chunk to chunk.
    inputs: dict of `[batch, n * chunk_len, ...]` arrays.
    chunk_len: C.
  Returns:
    `(final_states, outputs)` where each output leaf is stacked `[n, ...]`.
  """
  chunks = {name: split_into_chunks(value, chunk_len) for name, value in inputs.items()}
  num_chunks = next(iter(chunks.values())).shape[0]

  def body(carry, xs):
    chunk, index = xs
    return chunk_fn(carry, chunk, index)

  return jax.lax.scan(body, states, (chunks, jnp.arange(num_chunks)))

"""T5's relative position buckets (Raffel et al., 2020, sec. 2.1): a learned scalar per
(bucket, head) added to the attention logits.

The relative position of key j to query i is `r = pos_j - pos_i` (negative:
the key is earlier). With `num_buckets` buckets and `max_distance`:

- bidirectional (encoder): half the buckets for keys after the query
  (`r > 0`), half for the others, each side bucketing the distance `|r|`;
- unidirectional (causal decoder): all buckets for the distance
  `max(-r, 0)` (later keys are masked anyway and share bucket 0).

On one side of `n` buckets, distances below `n // 2` each have their own
bucket; larger distances share buckets whose widths grow logarithmically up
to `max_distance`: `n // 2 + floor(log(d / (n // 2)) / log(max_distance /
(n // 2)) * (n - n // 2))`, then clipped to the side's last bucket `n - 1`,
so every distance >= `max_distance` shares it.

The log runs in float32 as the reference implementation does (Mesh
TensorFlow, transformers), whose truncation decides the buckets at exact
boundaries (e.g. d = 16 of 32 buckets: log(2) / log(16) * 8 = 2). It runs
here in numpy, at trace time, into a `[max_distance + 1]` table of the
buckets of distances 0..max_distance, read with the (clipped) distance: XLA
would turn the division by the constant log(max_distance / (n // 2)) into a
multiplication by its reciprocal, which moves some of those boundaries.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def distance_buckets(num_buckets: int, max_distance: int) -> np.ndarray:
  """int32 `[max_distance + 1]`: the bucket of each distance 0..max_distance on one side of
  `num_buckets` buckets (module docstring); distances past `max_distance` share the last."""
  exact = num_buckets // 2
  distance = np.arange(max_distance + 1)
  with np.errstate(divide='ignore'):          # log(0) of distance 0, which is exact anyway
    scaled = (np.log(distance.astype(np.float32) / np.float32(exact))
              / np.float32(math.log(max_distance / exact)) * np.float32(num_buckets - exact))
  logarithmic = exact + np.where(distance < exact, 0.0, scaled).astype(np.int64)
  buckets = np.where(distance < exact, distance, np.minimum(logarithmic, num_buckets - 1))
  return buckets.astype(np.int32)


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool,
                             num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
  """int32 buckets in `[0, num_buckets)` of `relative_position` (`key - query`, any shape).

  Needs `num_buckets >= 4` (bidirectional: 2 per side at least, one of them exact)
  and `max_distance > num_buckets // 2` (models/model_settings.py checks both).
  """
  relative_position = jnp.asarray(relative_position, jnp.int32)
  if bidirectional:
    num_buckets //= 2
    offset = jnp.where(relative_position > 0, num_buckets, 0)   # keys after the query
    distance = jnp.abs(relative_position)
  else:
    offset = 0
    distance = jnp.maximum(-relative_position, 0)
  table = jnp.asarray(distance_buckets(num_buckets, max_distance))
  return offset + table[jnp.minimum(distance, max_distance)]


class RelativePositionBias(nn.Module):
  """`(q_positions [b, q], k_positions [b, k]) -> float32 bias [b, heads, q, k]`.

  One learned scalar per (bucket, head), parameter `embedding [num_buckets, heads]`
  (T5's `relative_attention_bias.weight`), read at the bucket of `k - q`. The bias
  depends on positions only, so keys from a cache of earlier chunks get theirs.
  """
  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool

  @nn.compact
  def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    table = self.param(
        'embedding',
        nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, 'heads')),
        (self.num_buckets, self.num_heads), jnp.float32)
    relative = k_positions[:, None, :] - q_positions[:, :, None]           # [b, q, k]
    buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets,
                                       self.max_distance)
    bias = jnp.take(table, buckets, axis=0)                                # [b, q, k, heads]
    return jnp.transpose(bias, (0, 3, 1, 2))

"""Compression functions of the Compressive Transformer (Rae et al., 2019, section 3.2).

The n_s entries evicted from a layer's XL memory, `[batch, n_s, d_model]`
hidden states with positions, segment ids and valid bits, are compressed by
rate c into floor(n_s / c) entries that are pushed into the compressed memory.

Groups: output j summarises group j, the c consecutive evicted entries
ending at evicted slot `n_s - 1 - (n_out - 1 - j) * c` (groups are aligned to
the newest entry; when c does not divide n_s the oldest n_s mod c entries are
dropped). The entry that ANCHORS a group is its newest valid entry; the
compressed entry takes the anchor's position and segment id, and is valid iff
the group has a valid entry. A window member takes part only if it is valid
and of the anchor's document, so a compressed entry never mixes documents.

Functions (`model.compressive.function` values):
- `max_pool`, `mean_pool`: over the group's participating entries.
- `conv`: 1D convolution with kernel = stride = c, `[c, d, d]` weights and a bias.
- `dilated_conv`: a causal dilated 1D convolution with stride c: output j sees
  `kernel` entries spaced `dilation` apart, ending at the group's newest slot
  (receptive field `(kernel - 1) * dilation + 1`, reaching into older groups;
  entries before the evicted block count as zeros).
- `most_used`: keeps the floor(n_s / c) valid entries with the highest average
  attention they received while in memory (Rae et al.: "most-used"), in their
  temporal order and at their own positions.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.layers.linear import projection
from longformer_jax.memory import fifo

COMPRESSION_FUNCTIONS = ('max_pool', 'mean_pool', 'conv', 'dilated_conv', 'most_used')
LEARNED = ('conv', 'dilated_conv')


def num_compressed(num_evicted: int, rate: int) -> int:
  """floor(n_s / c): how many entries n_s evicted ones become."""
  return num_evicted // rate


def window_slots(num_evicted: int, rate: int, kernel: int, dilation: int) -> np.ndarray:
  """Static `[n_out, kernel]` evicted slots each output reads, oldest first; -1 = outside.

  Output j's window ends at its group's newest slot and goes back in steps of
  `dilation`. Pooling and the plain convolution use kernel = c, dilation = 1
  (the window is the group itself).
  """
  n_out = num_compressed(num_evicted, rate)
  group_ends = num_evicted - 1 - (n_out - 1 - np.arange(n_out)) * rate      # [n_out]
  offsets = (np.arange(kernel) - (kernel - 1)) * dilation                   # [kernel], <= 0
  slots = group_ends[:, None] + offsets[None, :]
  return np.where(slots >= 0, slots, -1).astype(np.int32)


def group_anchors(evicted: fifo.FifoMemory, rate: int) -> fifo.FifoMemory:
  """The newest valid entry of each group of c: `[batch, n_out]` positions etc.

  Values are not set (zeros); the caller fills them.
  """
  slots = window_slots(evicted.capacity, rate, rate, 1)                      # [n_out, c]
  valid = evicted.valid[:, slots]                                           # [b, n_out, c]
  # Index of the newest valid member (the last True along the group), or 0.
  newest = rate - 1 - jnp.argmax(valid[:, :, ::-1], axis=-1)               # [b, n_out]
  anchor_slot = jnp.take_along_axis(jnp.broadcast_to(slots, valid.shape), newest[..., None],
                                    axis=-1)[..., 0]
  take = lambda a: jnp.take_along_axis(a, anchor_slot, axis=1)
  n_out = slots.shape[0]
  return fifo.FifoMemory(
      values=jnp.zeros((evicted.values.shape[0], n_out, *evicted.values.shape[2:]),
                       evicted.values.dtype),
      positions=take(evicted.positions), segment_ids=take(evicted.segment_ids),
      valid=jnp.any(valid, axis=-1))


def gather_windows(evicted: fifo.FifoMemory, anchors: fifo.FifoMemory, slots: np.ndarray):
  """Window members and whether each takes part.

  Returns:
    `(values [batch, n_out, kernel, d], takes_part [batch, n_out, kernel] bool)`;
    values of non-participating members are zero.
  """
  inside = jnp.asarray(slots >= 0)
  safe = np.maximum(slots, 0)
  values = evicted.values[:, safe]
  takes_part = (inside & evicted.valid[:, safe]
                & (evicted.segment_ids[:, safe] == anchors.segment_ids[:, :, None])
                & anchors.valid[:, :, None])
  values = jnp.where(takes_part[..., None], values, jnp.zeros((), values.dtype))
  return values, takes_part


def pool(values: jax.Array, takes_part: jax.Array, kind: str) -> jax.Array:
  """Max or mean over the window axis: `[b, n, k, d] -> [b, n, d]`; empty windows give 0."""
  if kind == 'max_pool':
    masked = jnp.where(takes_part[..., None], values, jnp.asarray(-jnp.inf, values.dtype))
    pooled = jnp.max(masked, axis=2)
    return jnp.where(jnp.any(takes_part, axis=2)[..., None], pooled, jnp.zeros((), values.dtype))
  count = jnp.sum(takes_part, axis=2)[..., None].astype(values.dtype)
  return jnp.sum(values, axis=2) / jnp.maximum(count, 1)


def most_used(evicted: fifo.FifoMemory, average_usage: jax.Array, n_out: int) -> fifo.FifoMemory:
  """The `n_out` valid entries with the highest `average_usage [batch, n_s]`, oldest first."""
  score = jnp.where(evicted.valid, average_usage.astype(jnp.float32), -jnp.inf)
  _, chosen = jax.lax.top_k(score, n_out)                                   # [b, n_out]
  chosen = jnp.sort(chosen, axis=1)                                         # temporal order
  return jax.tree_util.tree_map(
      lambda a: jnp.take_along_axis(a, chosen.reshape(chosen.shape + (1,) * (a.ndim - 2)), axis=1),
      evicted)


class Compressor(nn.Module):
  """`(evicted [batch, n_s] entries, average_usage [batch, n_s]) -> [batch, n_s // c] entries`.

  Attributes:
    function: one of `COMPRESSION_FUNCTIONS`.
    rate: c.
    d_model: feature size of the entries.
    kernel: `dilated_conv` window length (the others use c).
    dilation: `dilated_conv` spacing.
  """
  function: str
  rate: int
  d_model: int
  kernel: int                      # model.compressive.kernel_length()
  dilation: int                    # model.compressive.dilation
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, evicted: fifo.FifoMemory, average_usage: jax.Array) -> fifo.FifoMemory:
    # Configs are checked by `attention/compressive.CompressiveConfig`; these guard direct use.
    if self.function not in COMPRESSION_FUNCTIONS:
      raise ValueError(f'unknown compression {self.function!r}; '
                       f'choose one of {list(COMPRESSION_FUNCTIONS)}')
    if self.rate < 1:
      raise ValueError(f'compression rate must be >= 1, got {self.rate}')
    n_out = num_compressed(evicted.capacity, self.rate)
    if self.function == 'most_used':
      return most_used(evicted, average_usage, n_out)
    anchors = group_anchors(evicted, self.rate)
    if self.function == 'dilated_conv':
      slots = window_slots(evicted.capacity, self.rate, self.kernel, self.dilation)
    else:
      slots = window_slots(evicted.capacity, self.rate, self.rate, 1)
    values, takes_part = gather_windows(evicted, anchors, slots)
    if self.function in ('max_pool', 'mean_pool'):
      compressed = pool(values, takes_part, self.function)
    else:
      # Conv with stride = its group length: one matmul over [window, d_model].
      compressed = projection(self.d_model, num_in=2, kernel_axes=(None, 'embed', None),
                              use_bias=True, bias_axes=(None,), name='conv', dtype=self.dtype)(values)
      compressed = jnp.where(anchors.valid[..., None], compressed, jnp.zeros((), compressed.dtype))
    return anchors.replace(values=compressed.astype(evicted.values.dtype))

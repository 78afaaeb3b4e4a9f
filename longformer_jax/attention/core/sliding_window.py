"""Blocked sliding-window attention ("sliding chunks"): O(n·w) work and memory.

Window convention (the one `model.longformer.window` uses everywhere in
this codebase): `window` is ONE-SIDED, as `attention_window` in the original
Longformer code (Beltagy et al., 2020). With dilation d, query position i
may attend to key position j iff

  causal:     0 <= i - j <= window * d   and (i - j) % d == 0   (window + 1 keys)
  two-sided: |i - j| <= window * d       and (i - j) % d == 0   (2 * window + 1 keys)

Hugging Face's `LongformerConfig.attention_window` is the TOTAL span, i.e.
`2 * window` here (mixing them up doubles the window).

The kernel never builds an n x n array. Queries are cut into blocks of
`block_size`; block j attends to one key "slab", the `before + block + after`
key slots around it (`before = after = window` rounded up to whole blocks;
`after = 0` when causal). A `lax.scan` walks the query blocks (a few per
iteration) and slices each block's slab out of the padded keys, so the
`[heads, block, slab]` scores of one block stay in cache; the backward pass
recomputes them (FlashAttention-style). Cost: n * (block + 2w) * h * d
multiply-adds per matmul (block + w causal), i.e. (1 + block / 2w) times the
band itself; memory O(n * h * d) beyond one block's scores.

Slots and positions: the slab picks candidate keys by slot (query i sits at
key slot `key_offset + i`, as in `[cache; chunk]`); which candidates are
attended is decided by positions only (window rule, same document, valid).
It equals the dense-mask computation whenever slot distance equals position
distance, as in a chunk and its FIFO cache of a continuous stream.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SlabGeometry:
  """Where each query block's key slab lies in the padded key axis (static)."""
  block: int          # queries per block
  slab: int           # keys per slab: before + block + after
  first_block: int    # slab j starts at key slot (first_block + j) * block
  window: int
  dilation: int
  causal: bool
  unroll: int = 4     # lax.scan unroll: query blocks per compiled loop iteration

  def slab_start(self, j: jax.Array) -> jax.Array:
    return (self.first_block + j) * self.block


def _slab_mask(geometry: SlabGeometry, j: jax.Array, metadata: tuple) -> jax.Array:
  """`[b, 1, block, slab]` bool: which slab keys query block j attends to."""
  q_positions, q_segments, k_positions, k_segments, k_valid = metadata
  take = lambda x: jax.lax.dynamic_slice_in_dim(x, geometry.slab_start(j), geometry.slab, axis=1)
  k_pos, k_seg, k_ok = take(k_positions), take(k_segments), take(k_valid)
  q_pos, q_seg = q_positions[j], q_segments[j]                       # [b, block]
  mask = (k_ok[:, None, :] & (q_seg[:, :, None] == k_seg[:, None, :])
          & window_allowed(q_pos[:, :, None], k_pos[:, None, :], window=geometry.window,
                           dilation=geometry.dilation, causal=geometry.causal))
  return mask[:, None]


def _slab_keys(geometry: SlabGeometry, j: jax.Array, x: jax.Array) -> jax.Array:
  """Slab j of heads-major keys or values `[b, h, L, d]` -> `[b, h, slab, d]`."""
  return jax.lax.dynamic_slice_in_dim(x, geometry.slab_start(j), geometry.slab, axis=2)


def _block_logits(geometry, j, q_blocks, k, metadata):
  """`[b, h, block, slab]` float32 logits of query block j, -inf where masked."""
  logits = jnp.einsum('bhqd,bhkd->bhqk', q_blocks[j], _slab_keys(geometry, j, k),
                      preferred_element_type=jnp.float32)
  return jnp.where(_slab_mask(geometry, j, metadata), logits, -jnp.inf)


def _scan_blocks(geometry: SlabGeometry, body, carry, num_blocks: int):
  return jax.lax.scan(body, carry, jnp.arange(num_blocks), unroll=min(geometry.unroll, num_blocks))


def _window_forward(geometry, q_blocks, k, v, metadata):
  """Per query block: float32 softmax over its slab; returns `(out, lse)` stacked over blocks."""
  def block_step(_, j):
    logits = _block_logits(geometry, j, q_blocks, k, metadata)
    # Shift fully masked rows by 0 so that exp(-inf) = 0, no NaN.
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    unnormalised = jnp.exp(logits - row_max)
    total = jnp.sum(unnormalised, axis=-1, keepdims=True)
    safe_total = jnp.where(total > 0, total, 1.0)
    # Normalise after the value matmul ([block, d] instead of [block, slab] divisions).
    out = jnp.einsum('bhqk,bhkd->bhqd', unnormalised.astype(v.dtype), _slab_keys(geometry, j, v),
                     preferred_element_type=jnp.float32) / safe_total
    lse = jnp.where(total > 0, row_max + jnp.log(safe_total), -jnp.inf)[..., 0]
    return None, (out.astype(v.dtype), lse)
  _, (out, lse) = _scan_blocks(geometry, block_step, None, q_blocks.shape[0])
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def slab_attention(geometry: SlabGeometry, q_blocks: jax.Array, k: jax.Array, v: jax.Array,
                   metadata: tuple) -> tuple[jax.Array, jax.Array]:
  """Softmax attention of each query block over its key slab, one block at a time.

  Args:
    geometry: the static slab layout.
    q_blocks: `[blocks, b, h, block, d]` (already scaled).
    k, v: heads-major padded keys and values `[b, h, L, d]`.
    metadata: `(q_positions [blocks, b, block], q_segments [blocks, b, block],
      k_positions [b, L], k_segments [b, L], k_valid [b, L])`.
  Returns:
    `(out [blocks, b, h, block, d] in v's dtype, lse [blocks, b, h, block] float32)`.

  A `lax.scan` over query blocks keeps the `[h, block, slab]` arrays of one
  block in cache instead of materialising `[n, h, block, slab]` arrays (on
  CPU that alone made forward + backward 1.4x faster; what remains is mostly
  the per-head `[block, d] x [d, slab]` matmuls). The backward pass is
  FlashAttention's (Dao et al., 2022, alg. 2): it recomputes the logits from
  q, k and the saved lse, then with P the weights, dO the output's cotangent
  and g the lse's, dS = P * (dO V^T - rowsum(dO * O) + g).
  """
  return _window_forward(geometry, q_blocks, k, v, metadata)


def _slab_attention_fwd(geometry, q_blocks, k, v, metadata):
  out, lse = _window_forward(geometry, q_blocks, k, v, metadata)
  return (out, lse), (q_blocks, k, v, metadata, out, lse)


def _slab_attention_bwd(geometry, residuals, cotangents):
  q_blocks, k, v, metadata, out, lse = residuals
  d_out, d_lse = cotangents
  d_out = d_out.astype(jnp.float32)
  # rowsum(dO * O) equals rowsum(dP * P) (O = P V): a [block, d] reduction.
  row_dot = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)          # [blocks, b, h, block]

  def block_step(carry, j):
    d_k, d_v = carry
    logits = _block_logits(geometry, j, q_blocks, k, metadata)
    # A fully masked row has lse -inf and logits -inf: shift it by 0, exp gives 0.
    block_lse = lse[j]
    weights = jnp.exp(logits - jnp.where(jnp.isfinite(block_lse), block_lse, 0.0)[..., None])
    k_j, v_j, d_out_j = _slab_keys(geometry, j, k), _slab_keys(geometry, j, v), d_out[j]
    d_weights = jnp.einsum('bhqd,bhkd->bhqk', d_out_j.astype(v.dtype), v_j,
                           preferred_element_type=jnp.float32)
    d_logits = weights * (d_weights - (row_dot[j] - d_lse[j])[..., None])
    d_logits = d_logits.astype(q_blocks.dtype)
    d_q = jnp.einsum('bhqk,bhkd->bhqd', d_logits, k_j, preferred_element_type=jnp.float32)
    d_k_j = jnp.einsum('bhqk,bhqd->bhkd', d_logits, q_blocks[j], preferred_element_type=jnp.float32)
    d_v_j = jnp.einsum('bhqk,bhqd->bhkd', weights.astype(v.dtype), d_out_j.astype(v.dtype),
                       preferred_element_type=jnp.float32)
    start = geometry.slab_start(j)
    accumulate = lambda total, part: jax.lax.dynamic_update_slice_in_dim(
        total, jax.lax.dynamic_slice_in_dim(total, start, geometry.slab, axis=2) + part, start,
        axis=2)
    return (accumulate(d_k, d_k_j), accumulate(d_v, d_v_j)), d_q.astype(q_blocks.dtype)

  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  (d_k, d_v), d_q = _scan_blocks(geometry, block_step, (zeros(k), zeros(v)), q_blocks.shape[0])
  return d_q, d_k.astype(k.dtype), d_v.astype(v.dtype), None


slab_attention.defvjp(_slab_attention_fwd, _slab_attention_bwd)


def window_allowed(q_positions: jax.Array, k_positions: jax.Array, *, window: int,
                   dilation: int, causal: bool) -> jax.Array:
  """The window rule on positions, broadcasting `q_positions` against `k_positions`."""
  distance = q_positions - k_positions
  reach = window * dilation
  allowed = (distance <= reach) & (distance >= (0 if causal else -reach))
  if dilation > 1:
    allowed &= distance % dilation == 0
  return allowed


def _pad_axis1(x: jax.Array, front: int, back: int, value=0) -> jax.Array:
  """Pads the sequence axis (axis 1 of `[b, L, ...]`)."""
  widths = [(0, 0)] * x.ndim
  widths[1] = (front, back)
  return jnp.pad(x, widths, constant_values=value)


def blocked_window_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                             q_positions: jax.Array, q_segments: jax.Array,
                             k_positions: jax.Array, k_segments: jax.Array, k_valid: jax.Array,
                             *, window: int, block_size: int, causal: bool = True,
                             dilation: int = 1, key_offset: int = 0, scale: float = 1.0
                             ) -> tuple[jax.Array, jax.Array]:
  """Sliding-window attention of `q` over `k, v`, by blocks.

  Args:
    q: `[batch, lq, heads, head_dim]`; query i is at key slot `key_offset + i`.
    k, v: `[batch, lk, heads, head_dim]`.
    q_positions, q_segments: `[batch, lq]` int32.
    k_positions, k_segments, k_valid: `[batch, lk]`.
    window: reach in key SLOTS on each allowed side (the slab size); the
      position rule is `window_allowed(..., window, dilation)`. Dilated
      heads call this on an interleaved layout (see attention/longformer/dilated_window.py) where
      one slot is `dilation` positions.
    block_size: queries per block.
    scale: multiplies the logits (1/sqrt(head_dim)).
  Returns:
    `(out [batch, lq, heads, head_dim] in v's dtype, lse [batch, lq, heads] float32)`.
  """
  batch, lq, heads, head_dim = q.shape
  lk = k.shape[1]
  block_size = max(1, min(block_size, lq))
  num_blocks = -(-lq // block_size)
  blocks_per_side = -(-window // block_size)
  before = blocks_per_side * block_size
  after = 0 if causal else before

  # Pad keys so that every slab starts on a block boundary at slot >= 0.
  start = key_offset - before
  front = -start if start < 0 else (-start) % block_size
  first_block = (start + front) // block_size
  total = (first_block + num_blocks - 1) * block_size + before + block_size + after
  back = total - front - lk
  if back < 0:
    raise ValueError(f'{lk} keys extend past the last query block ({key_offset=}, {lq=})')
  pad = lambda x, value=0: _pad_axis1(x, front, back, value)
  # Heads-major layout [b, h, L, d]: the einsums are then plain batched
  # matmuls over (b, h) with the contraction on the minor axis.
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  q_back = num_blocks * block_size - lq
  blocked = lambda x: _pad_axis1(x, 0, q_back).reshape(x.shape[0], num_blocks, block_size,
                                                       *x.shape[2:])
  blocks_first = lambda x: jnp.swapaxes(blocked(x), 0, 1)               # [n, b, block, ...]
  q_blocks = jnp.transpose(blocked(q * jnp.asarray(scale, q.dtype)), (1, 0, 3, 2, 4))
  metadata = (blocks_first(q_positions), blocks_first(q_segments), pad(k_positions),
              pad(k_segments), pad(k_valid, False))
  geometry = SlabGeometry(block=block_size, slab=before + block_size + after,
                          first_block=first_block, window=window, dilation=dilation, causal=causal)
  out, lse = slab_attention(geometry, q_blocks, heads_major(pad(k)), heads_major(pad(v)), metadata)
  # [n, b, h, block, d] -> [b, n * block, h, d]
  out = jnp.transpose(out, (1, 0, 3, 2, 4)).reshape(batch, num_blocks * block_size, heads, head_dim)
  lse = jnp.transpose(lse, (1, 0, 3, 2)).reshape(batch, num_blocks * block_size, heads)
  return out[:, :lq], lse[:, :lq]


def band_pairs(seq_len: int, window: int, causal: bool) -> int:
  """Number of (query, key) pairs inside the band of a `seq_len` sequence (dilation 1)."""
  n, w = seq_len, min(window, seq_len - 1)
  one_side = n * w - w * (w + 1) // 2   # sum_i min(i, w)
  return n + one_side * (1 if causal else 2)


def auto_block_size(window: int) -> int:
  """Default queries per block: a fraction of the window, so that the slab is
  (w + block) or (2w + block) keys, and the einsums stay large."""
  return max(1, min(window, 128 if window >= 256 else math.ceil(window / 2)))

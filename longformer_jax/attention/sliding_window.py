"""Blocked sliding-window attention ("sliding chunks"): O(n·w) work and memory.

Window convention (the one `model.window` uses everywhere in this codebase):
`window` is ONE-SIDED, as `attention_window` in the original Longformer
code (Beltagy et al., 2020). With dilation d, query position i may attend to
key position j iff

  causal:     0 <= i - j <= window * d   and (i - j) % d == 0   (window + 1 keys)
  two-sided: |i - j| <= window * d       and (i - j) % d == 0   (2 * window + 1 keys)

Hugging Face's `LongformerConfig.attention_window` is the TOTAL span, i.e.
`2 * window` here (NOTES.md: mixing them up doubles the window).

The kernel never builds an n x n array. Queries are cut into blocks of
`block_size`; block j attends to one key "slab", the `before + block + after`
key slots around it (`before = after = window` rounded up to whole blocks;
`after = 0` when causal). The slabs of all blocks are stacked and every
block's scores come from one batched einsum `[blocks, block, slab]`, which
XLA runs as large matmuls (no scan over blocks). Cost: n * (block + 2w) * h * d
multiply-adds per matmul (block + w causal), i.e. (1 + block / 2w) times the
band itself.

Slots and positions: the slab picks candidate keys by slot (query i sits at
key slot `key_offset + i`, as in `[cache; chunk]`); which candidates are
attended is decided by positions only (window rule, same document, valid).
It equals the dense-mask computation whenever slot distance equals position
distance, as in a chunk and its FIFO cache of a continuous stream.
"""

import math

import jax
import jax.numpy as jnp



def _finite_or_zero(x: jax.Array) -> jax.Array:
  return jnp.where(jnp.isfinite(x), x, 0.0)


def _slab_attention_forward(q, k, v, mask):
  """Shapes: q `[b, h, n, block, d]`, k/v `[b, h, n, slab, d]`, mask `[b, 1, n, block, slab]`."""
  logits = jnp.einsum('bhnqd,bhnkd->bhnqk', q, k, preferred_element_type=jnp.float32)
  logits = jnp.where(mask, logits, -jnp.inf)
  # Float32 softmax; shift fully masked rows by 0 so that exp(-inf) = 0, no NaN.
  row_max = jax.lax.stop_gradient(_finite_or_zero(jnp.max(logits, axis=-1, keepdims=True)))
  unnormalised = jnp.exp(logits - row_max)
  total = jnp.sum(unnormalised, axis=-1, keepdims=True)
  safe_total = jnp.where(total > 0, total, 1.0)
  # Normalise after the value matmul ([block, d] instead of [block, slab] divisions).
  out = jnp.einsum('bhnqk,bhnkd->bhnqd', unnormalised.astype(v.dtype), v,
                   preferred_element_type=jnp.float32) / safe_total
  lse = jnp.where(total > 0, row_max + jnp.log(safe_total), -jnp.inf)[..., 0]
  return out.astype(v.dtype), lse, unnormalised, safe_total


@jax.custom_vjp
def slab_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                   mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Softmax attention of each query block over its key slab.

  Args:
    q: `[b, h, blocks, block, d]` (already scaled).
    k, v: `[b, h, blocks, slab, d]`.
    mask: `[b, 1, blocks, block, slab]` bool.
  Returns:
    `(out [b, h, blocks, block, d] in v's dtype, lse [b, h, blocks, block] float32)`.

  The backward pass is written out (as in FlashAttention's, without
  recomputation): with W the weights, dO the output's cotangent and g the
  lse's, dL = W * (dO V^T - rowsum(dO * O) + g). It keeps only the
  unnormalised exponentials of the forward pass and touches each
  `[block, slab]` array a minimum number of times, which is what the time
  on CPU depends on beyond the four matmuls.
  """
  out, lse, _, _ = _slab_attention_forward(q, k, v, mask)
  return out, lse


def _slab_attention_fwd(q, k, v, mask):
  out, lse, unnormalised, safe_total = _slab_attention_forward(q, k, v, mask)
  return (out, lse), (q, k, v, out, unnormalised, safe_total)


def _slab_attention_bwd(residuals, cotangents):
  q, k, v, out, unnormalised, safe_total = residuals
  d_out, d_lse = cotangents
  d_out = d_out.astype(jnp.float32)
  # rowsum(dO * O) equals rowsum(dW * W) (O = W V): a [block, d] reduction.
  row_dot = jnp.sum(d_out * out.astype(jnp.float32), axis=-1, keepdims=True)
  d_weights = jnp.einsum('bhnqd,bhnkd->bhnqk', d_out.astype(v.dtype), v,
                         preferred_element_type=jnp.float32)
  # W = E / total: fold 1/total into the [block]-sized factors instead of forming W.
  d_logits = unnormalised * ((d_weights - row_dot + d_lse[..., None]) / safe_total)
  d_v = jnp.einsum('bhnqk,bhnqd->bhnkd', unnormalised.astype(v.dtype),
                   (d_out / safe_total).astype(v.dtype), preferred_element_type=jnp.float32)
  d_logits = d_logits.astype(q.dtype)
  d_q = jnp.einsum('bhnqk,bhnkd->bhnqd', d_logits, k, preferred_element_type=jnp.float32)
  d_k = jnp.einsum('bhnqk,bhnqd->bhnkd', d_logits, q, preferred_element_type=jnp.float32)
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None


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


def _slabs(x: jax.Array, first_block: int, num_blocks: int, blocks_per_slab: int,
           block_size: int) -> jax.Array:
  """`[*lead, L, ...]` -> `[*lead, num_blocks, slab, ...]` along the sequence axis.

  The sequence axis is axis 1 for `[b, L]` metadata and axis 2 for heads-major
  `[b, h, L, d]` features (L a multiple of block_size). Slab j is the key
  blocks `first_block + j ... first_block + j + blocks_per_slab - 1`.
  """
  axis = 1 if x.ndim == 2 else 2
  lead, length, rest = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
  blocks = x.reshape(*lead, length // block_size, block_size, *rest)
  shifted = [jax.lax.slice_in_dim(blocks, first_block + t, first_block + t + num_blocks, axis=axis)
             for t in range(blocks_per_slab)]
  stacked = jnp.stack(shifted, axis=axis + 1)  # [*lead, num_blocks, blocks_per_slab, block, ...]
  return stacked.reshape(*lead, num_blocks, blocks_per_slab * block_size, *rest)


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
      heads call this on an interleaved layout (see dilated_window.py) where
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
  blocks_per_slab = blocks_per_side + 1 + (0 if causal else blocks_per_side)

  # Pad keys so that every slab starts on a block boundary at slot >= 0.
  start = key_offset - before
  front = -start if start < 0 else (-start) % block_size
  first_block = (start + front) // block_size
  total = (first_block + num_blocks - 1) * block_size + before + block_size + after
  back = total - front - lk
  if back < 0:
    raise ValueError(f'{lk} keys extend past the last query block ({key_offset=}, {lq=})')
  pad = lambda x, value=0: _pad_axis1(x, front, back, value)
  slab = lambda x: _slabs(x, first_block, num_blocks, blocks_per_slab, block_size)
  # Heads-major layout [b, h, L, d]: the einsums below are then plain batched
  # matmuls over (b, h, block) with the contraction on the minor axis.
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  k_slab, v_slab = slab(heads_major(pad(k))), slab(heads_major(pad(v)))
  kpos_slab, kseg_slab = slab(pad(k_positions)), slab(pad(k_segments))
  kvalid_slab = slab(pad(k_valid, False))

  q_back = num_blocks * block_size - lq
  blocked = lambda x: _pad_axis1(x, 0, q_back).reshape(x.shape[0], num_blocks, block_size,
                                                       *x.shape[2:])
  q_blocks = jnp.transpose(blocked(q * jnp.asarray(scale, q.dtype)), (0, 3, 1, 2, 4))  # [b, h, n, block, d]
  qpos_blocks, qseg_blocks = blocked(q_positions), blocked(q_segments)

  # [b, blocks, block, slab]: shared by all heads.
  mask = (kvalid_slab[:, :, None, :]
          & (qseg_blocks[:, :, :, None] == kseg_slab[:, :, None, :])
          & window_allowed(qpos_blocks[:, :, :, None], kpos_slab[:, :, None, :],
                           window=window, dilation=dilation, causal=causal))
  out, lse = slab_attention(q_blocks, k_slab, v_slab, mask[:, None])
  out = jnp.swapaxes(out.reshape(batch, heads, num_blocks * block_size, head_dim)[:, :, :lq], 1, 2)
  lse = jnp.swapaxes(lse.reshape(batch, heads, num_blocks * block_size)[:, :, :lq], 1, 2)
  return out, lse


def band_pairs(seq_len: int, window: int, causal: bool) -> int:
  """Number of (query, key) pairs inside the band of a `seq_len` sequence (dilation 1)."""
  n, w = seq_len, min(window, seq_len - 1)
  one_side = n * w - w * (w + 1) // 2   # sum_i min(i, w)
  return n + one_side * (1 if causal else 2)


def auto_block_size(window: int) -> int:
  """Default queries per block: a fraction of the window, so that the slab is
  (w + block) or (2w + block) keys, and the einsums stay large."""
  return max(1, min(window, 128 if window >= 256 else math.ceil(window / 2)))

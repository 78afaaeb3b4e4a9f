"""Splash attention (Pallas block-sparse flash attention) with the project's masks.

`splash_attention(q, k, v, ...)` computes, for queries and keys of ONE chunk
(self-attention, no memory),

  out_i = sum_j softmax_j(q_i . k_j | allowed(i, j)) v_j,
  allowed(i, j) = valid_j & seg_i == seg_j & -left <= (p_j - p_i) <= right,

exactly what `dot_product.attend` computes with the dense mask
`masking.causal_document_mask` (plus a window): causal is `right = 0`,
bidirectional is `left = right = None` (unbounded), the Longformer's one-sided
window w is `(w, 0)` causal and `(w, w)` two-sided, a StreamingLLM window of
the w most recent tokens is `(w - 1, 0)`.

How each rule reaches the kernel (`jax.experimental.pallas.ops.tpu.splash_attention`):
- the window and causal rules are its static `LocalMask` on array slots. They
  equal the rules on positions (docs/design.md, contract 2) because positions
  are consecutive along a chunk (`p_j - p_i = j - i`; stream batches and encoder
  contexts build them so), which is the one precondition of this path;
- documents are its segment ids (a key of another document has another id);
- padding is a segment id too: an invalid key gets an id no query has
  (one below the row's smallest id), so no query ever sees it;
- a query with no allowed key (a padding query before any valid key of its
  document) gives 0, like the dense reference: a constant "sink" logit of
  -1e30 starts every row's running max (the kernel's `sinks`), so it adds
  exp(-1e30 - m) = 0 to every non-empty row and turns an empty row's
  denominator into 1 over a numerator of 0 (values of masked keys are
  weighted by exp(mask_value + 1e30) = 0). The backward pass sees the same
  log-sum-exp, so gradients of empty rows are 0 as well.

Block sizes: the kernel needs query and key blocks that are multiples of 128
(`NUM_LANES`) and sequence lengths that are multiples of the blocks. Any chunk
length works here: q, k, v are padded at the end to a multiple of 128 with
keys no query sees (padding segment id), and the padded queries are dropped,
so lengths below 128 are exact but waste compute (the block is the largest of
512, 256, 128 dividing the padded length).

The caller scales the queries (the kernel does not). On TPU the kernel is
compiled by Mosaic; elsewhere it runs in Pallas interpret mode (the tests on
CPU), with the same numerics up to float32 rounding.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

LANES = splash.NUM_LANES                 # 128: every block is a multiple of this
BLOCK_CHOICES = (512, 256, LANES)        # largest first
EMPTY_ROW_SINK = -1e30                   # see the module docstring: empty rows give 0


def padded_length(length: int) -> int:
  """`length` rounded up to a multiple of 128 (the kernel's lane width)."""
  return -(-length // LANES) * LANES


def block_size(padded: int) -> int:
  """The largest of 512, 256, 128 dividing `padded` (a multiple of 128)."""
  return next(b for b in BLOCK_CHOICES if padded % b == 0)


@functools.lru_cache(maxsize=64)
def _kernel(length: int, num_heads: int, left: Optional[int], right: Optional[int],
            interpret: bool):
  """The splash kernel for `[heads, length, head_dim]` inputs and one window (cached)."""
  block = block_size(length)
  if left is None and right is None:     # LocalMask would capture a constant all-True block
    mask = splash_mask.FullMask((length, length))
  else:
    mask = splash_mask.LocalMask((length, length), window_size=(left, right), offset=0)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            use_fused_bwd_kernel=True)
  # Concrete (not traced) mask metadata, so the cached kernel can serve any trace.
  with jax.ensure_compile_time_eval():
    return splash.make_splash_mha(splash_mask.MultiHeadMask([mask] * num_heads),
                                  block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)


def default_interpret() -> bool:
  """Compiled on TPU, Pallas interpret mode on every other platform."""
  return jax.default_backend() != 'tpu'


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                     valid: jax.Array, *, left: Optional[int], right: Optional[int],
                     interpret: Optional[bool] = None) -> jax.Array:
  """Masked softmax attention within one chunk through the splash kernel.

  Args:
    q: `[batch, chunk, heads, head_dim]`, already scaled (e.g. by 1/sqrt(head_dim)).
    k, v: `[batch, chunk, heads, head_dim]`, the same chunk's keys and values.
    segment_ids: `[batch, chunk]` int32 document ids of the chunk's tokens.
    valid: `[batch, chunk]` bool, the key is real (not padding).
    left, right: the window, keys at slot offsets `-left..right` from the
      query (None: unbounded on that side); causal is `right = 0`.
    interpret: Pallas interpret mode (None: off on TPU only).
  Returns:
    `[batch, chunk, heads, head_dim]` in q's dtype; rows with no allowed key are 0.
  """
  batch, chunk, heads, _ = q.shape
  interpret = default_interpret() if interpret is None else interpret
  length = padded_length(chunk)
  pad = length - chunk
  absent = jnp.min(segment_ids, axis=1, keepdims=True) - 1          # no query has it
  in_chunk = jnp.arange(length) < chunk
  q_segments = jnp.where(in_chunk, jnp.pad(segment_ids, ((0, 0), (0, pad))), absent)
  kv_segments = jnp.where(in_chunk & jnp.pad(valid, ((0, 0), (0, pad))),
                          jnp.pad(segment_ids, ((0, 0), (0, pad))), absent)
  to_heads_major = lambda a: jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  kernel = _kernel(length, heads, left, right, bool(interpret))
  sinks = jnp.full((heads,), EMPTY_ROW_SINK, jnp.float32)

  def one_row(q_row, k_row, v_row, q_seg, kv_seg):
    return kernel(q_row, k_row, v_row, splash.SegmentIds(q=q_seg, kv=kv_seg), sinks)

  out = jax.vmap(one_row)(to_heads_major(q), to_heads_major(k), to_heads_major(v),
                          q_segments, kv_segments)                   # [b, h, length, d]
  return out.transpose(0, 2, 1, 3)[:, :chunk]

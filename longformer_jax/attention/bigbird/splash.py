"""BigBird's block pattern (window + ITC global + random blocks) through the splash kernel.

`bigbird_splash` computes exactly what `attention/bigbird.bigbird_attention`
computes when no token is made global by its flags (`max_global_tokens = 0`),
for blocks of b slots, blk(t) = t // b on slots relative to the chunk's first
token:

  sparse rows   blk(j) in window of blk(i) (|blk(i) - blk(j)| <= w), or
                blk(j) in R[blk(i)] (the layer's random blocks), or
                j is in the first g blocks (a global key);
                and j <= i when causal             -> one splash kernel, `BigBirdBlocks`
  global rows   a valid query in the first g blocks attends to the whole chunk
                (j <= i when causal)               -> dense XLA, [batch, G, n], as attention.py

documents and padding on top (segment ids), 0 for a query with no key.

Why this is a static mask: R depends only on (seed, layer index, number of
blocks), Python ints known when the layer is traced (`BigBirdAttention.pattern`
draws it from `fold_in(PRNGKey(seed), layer_index)`, never from a traced key),
so it is evaluated here once, as numpy, and becomes part of the hashable rule
(the kernel cache key). The ITC global slots are the first g blocks (static);
padding never is global, which the segment ids express for the keys, and for
the queries by keeping the sparse row where the global query is padding (as
bigbird/attention.py does). Tokens flagged in `ctx.global_flags` are data: their key
columns are not static, so `max_global_tokens > 0` stays on xla.

The rule looks up R by query block, which the kernel cannot do in-kernel; it is
a `LoadedRuleMask` (`in_kernel = False`, splash_kernels.py): its partial blocks
are found block by block in numpy when the kernel is built and loaded. The
block-sparse skipping then follows the BigBird pattern. Positions must be
consecutive along the chunk (the splash path's precondition).
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import splash_kernels
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask


@dataclasses.dataclass(frozen=True)
class BigBirdBlocks:
  """BigBird's sparse rows on slot ids: window blocks | random blocks R | global key blocks."""
  block: int
  window_blocks: int
  global_blocks: int
  causal: bool
  random: tuple                   # R as a tuple of tuples, [num_blocks][r] key blocks
  in_kernel: ClassVar[bool] = False

  def allows(self, q_ids, kv_ids):
    xp = jnp if isinstance(q_ids, jax.Array) or isinstance(kv_ids, jax.Array) else np
    q_block, kv_block = q_ids // self.block, kv_ids // self.block
    allowed = (abs(q_block - kv_block) <= self.window_blocks) | (kv_block < self.global_blocks)
    table = np.asarray(self.random, np.int32).reshape(len(self.random), -1)
    for r in range(table.shape[1]):
      # Slots past the last block (kernel padding) are clipped: no query there is kept.
      allowed = allowed | (xp.take(xp.asarray(table[:, r]), q_block, mode='clip') == kv_block)
    if self.causal:
      allowed = allowed & (kv_ids <= q_ids)
    return allowed


def kernel_pattern(model, section) -> backends.KernelPattern:
  """What a BigBird layer asks of a kernel (config checks, `resolve_backend`)."""
  causal = model.causal
  if section.max_global_tokens:
    return backends.KernelPattern(right=0 if causal else None, dense_mask_ok=False,
                                  unsupported='BigBird tokens made global by their flags '
                                              '(data-dependent key columns)')
  return backends.KernelPattern(right=0 if causal else None, dense_mask_ok=False,
                                splash_only='the BigBird block pattern',
                                block_sparse_on_gpu=True)


def static_random_blocks(pattern_fn, chunk_len: int) -> tuple:
  """`pattern_fn(chunk_len)` (the layer's R) evaluated at trace time -> a tuple of tuples."""
  with jax.ensure_compile_time_eval():
    table = np.asarray(pattern_fn(chunk_len))
  return tuple(tuple(int(b) for b in row) for row in table)


def bigbird_splash(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                   valid: jax.Array, random_blocks: tuple, *, block: int, window_blocks: int,
                   global_blocks: int, causal: bool, interpret=None, kernel=None) -> jax.Array:
  """BigBird attention without flagged global tokens: sparse rows on splash, global rows XLA.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    segment_ids, valid: `[batch, n]`; positions must be consecutive along the chunk.
    random_blocks: R as a tuple of tuples (`static_random_blocks`).
    block, window_blocks, global_blocks, causal: the layer's settings.
    interpret: Pallas interpret mode (None: off on TPU only).
    kernel: the masked-attention kernel for the sparse rows (default splash;
      `block_sparse_flash.block_sparse_attention` on a GPU).
  Returns:
    `[batch, n, heads, head_dim]` in q's dtype.
  """
  rule = BigBirdBlocks(block, window_blocks, global_blocks, causal, random_blocks)
  out = (kernel or splash_kernels.splash_attention)(q, k, v, segment_ids, valid, mask=rule,
                                                    interpret=interpret)
  n = q.shape[1]
  num_globals = min(global_blocks * block, n)
  if not num_globals:
    return out
  # Global queries (the first g blocks) attend to the whole chunk: [batch, G] x [batch, n].
  slots = jnp.arange(n)[None].repeat(q.shape[0], axis=0)      # slot order = position order
  mask = causal_document_mask(slots[:, :num_globals], segment_ids[:, :num_globals], slots,
                              segment_ids, valid, causal=causal)
  logits = jnp.einsum('bghd,bkhd->bhgk', q[:, :num_globals], k)
  global_out = attend(logits, mask, v).astype(out.dtype)
  rows = jnp.where(valid[:, :num_globals, None, None], global_out, out[:, :num_globals])
  return out.at[:, :num_globals].set(rows)

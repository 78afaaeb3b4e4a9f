"""Vanilla softmax attention with rotary positions and an optional cache.

Causal (decoder) or bidirectional (encoder). With `mem_len = 0` it attends
within the chunk only; with `mem_len > 0` it also attends to a FIFO cache of
the previous `mem_len` hidden states (rotated at their stored positions, so
the cache is exact for RoPE: keys are made from cached hidden states at
every step, never cached after rotation).

Kernels (`model.attention_backend`, attention/core/attention_backend.py): the
softmax runs through XLA (dense mask), splash (TPU; in-chunk only, `mem_len =
0`: with a cache the keys' slots are not always full, so it stays on XLA) or
cuDNN (GPU, bfloat16; the dense position mask as its bias, with or without a
cache). Every path computes the same masked softmax (docs/kernels.md).
On a mesh with a `sequence` axis > 1, the softmax (no position bias; with or
without a cache) is split along the chunk's length over that axis (ring or
all-gather attention, the cache replicated on every device;
attention/sequence_parallel/attention.py; docs/scaling.md).
T5's relative position bias (`position_embedding='relative_buckets'`) is
added to the logits on the XLA path only; splash and cuDNN are then
unavailable (`auto` runs XLA).

Shared settings for imported checkpoints (docs/import.md): grouped-query
attention, q/k/v and output biases, the RoPE base and scaling, learned
positions (q and k unrotated), T5's relative position buckets (q and k
unrotated, a learned bias per bucket and head read from the query and key
positions, so cached keys get theirs too); attention/core/checkpoint_heads.py.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.vanilla.cudnn_attention import cudnn_attention
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.block_sparse_flash import masked_kernel
from longformer_jax.memory import fifo
from longformer_jax.parallel import sequence_settings
from longformer_jax.attention.sequence_parallel.attention import sequence_parallel_attention


class VanillaAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  No settings of its own (no section): it reads only `shared` (attention/shared_settings.py),
  the shared `model.causal`, `model.mem_len`, `model.attention_backend` and those of the
  module docstring (`shared.heads`).
  """
  reads_mem_len = True

  shared: SharedSettings
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def kernel_pattern(model, section=None) -> backends.KernelPattern:
    """What a layer with the shared settings `model` asks of a kernel (config checks)."""
    del section
    return _pattern(model.causal, in_chunk=model.mem_len == 0,
                    position_bias=model.position_embedding == 'relative_buckets')

  @staticmethod
  def init_state(config: None, shared: SharedSettings, batch_size: int, dtype=jnp.float32):
    """An empty cache of `shared.mem_len` hidden states per row:
    `[batch_size, mem_len, d_model]` (`config`: None, vanilla has no section)."""
    del config
    return fifo.create(batch_size, shared.mem_len, (shared.d_model,), dtype)

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    heads, num_heads, head_dim = self.shared.heads, self.shared.num_heads, self.shared.head_dim
    context, new_state = projections.memory_and_chunk(state, x, ctx)
    q = heads.query(x, num_heads, head_dim, self.dtype)
    k, v = heads.keys_values(context.values, num_heads, head_dim, self.dtype)
    # Rotate relative to the chunk's first position: q.k depends only on the
    # difference, and small angles keep float32 exact on long streams.
    origin = ctx.positions[:, :1]
    extent = heads.extent(ctx.positions, ctx.valid)   # dynamic, longrope: the chunk's length
    q = heads.rotate(q, ctx.positions - origin, extent)
    k = heads.rotate(k, context.positions - origin, extent)
    bias = heads.position_bias(ctx.positions, context.positions, num_heads,
                               bidirectional=not self.shared.causal)   # [b, h, c, mem + c]
    out = self._attend(q, k, v, ctx, context, bias)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return heads.output(out, self.shared.d_model, self.dtype), new_state, {}

  def _attend(self, q, k, v, ctx: AttentionContext, context: fifo.FifoMemory,
              bias: jax.Array | None = None) -> jax.Array:
    """Masked softmax of `q [b, c, h, d]` over `k, v [b, mem + c, h, d]` -> `[b, c, h, d]`;
    `bias [b, h, c, mem + c]` (or None) added to the scaled logits."""
    causal, head_dim = self.shared.causal, self.shared.head_dim
    in_chunk = k.shape[1] == q.shape[1]          # no cache (mem_len = 0)
    if bias is None and sequence_settings.sequence_axis_size() > 1:
      # The chunk split along its length over the mesh's sequence axis; a cache (the first
      # `mem` keys) stays whole on every device, one more softmax part (docs/scaling.md).
      mem = k.shape[1] - q.shape[1]
      memory = None if in_chunk else (k[:, :mem], v[:, :mem], context.positions[:, :mem],
                                      context.segment_ids[:, :mem], context.valid[:, :mem])
      settings = sequence_settings.current()
      return sequence_parallel_attention(
          q, k[:, mem:], v[:, mem:], ctx.positions, ctx.segment_ids, ctx.valid,
          mesh=jax.sharding.get_abstract_mesh(), causal=causal, method=settings.method,
          load_balance=settings.load_balance and causal,
          scale=head_dim ** -0.5, memory=memory).astype(self.dtype)
    backend = backends.resolve_backend(
        self.shared.attention_backend, _pattern(causal, in_chunk, bias is not None),
        dtype=jnp.dtype(self.dtype).name, head_dim=head_dim)
    if backend in ('splash', 'pallas_gpu'):   # in-chunk only: k, v are the chunk's own tokens
      scaled = q * jnp.asarray(head_dim ** -0.5, q.dtype)
      return masked_kernel(backend)(scaled, k, v, ctx.segment_ids, ctx.valid, left=None,
                                    right=0 if causal else None).astype(self.dtype)
    mask = causal_document_mask(ctx.positions, ctx.segment_ids, context.positions,
                                context.segment_ids, context.valid, causal=causal)
    if backend == 'cudnn':
      return cudnn_attention(q, k, v, mask, scale=head_dim ** -0.5,
                             causal=causal and in_chunk).astype(self.dtype)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / jnp.sqrt(head_dim).astype(self.dtype)
    if bias is not None:
      logits = logits.astype(jnp.float32) + bias
    return attend(logits, mask, v)


def _pattern(causal: bool, in_chunk: bool, position_bias: bool = False) -> backends.KernelPattern:
  return backends.KernelPattern(left=None, right=0 if causal else None, in_chunk=in_chunk,
                                unsupported='a relative position bias' if position_bias else '')

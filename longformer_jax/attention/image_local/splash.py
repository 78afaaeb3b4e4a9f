"""The Image Transformer's local 1D attention through the splash kernel.

`image_local_1d_splash` computes exactly what
`attention/image_local.gathered_local_attention` computes for `layout='1d'`
(query blocks of `query_len` slots; documents and padding on top; 0 for a
query with no allowed key), as one splash kernel whose mask is the rule on
slot ids `BlockLocal(query_len, memory_len, causal)`:

  causal:        allowed(i, j) = start(i) - memory_len <= j <= i,
  bidirectional: allowed(i, j) = start(i) - memory_len <= j < start(i) + query_len + memory_len,

with start(i) = (i // query_len) * query_len, the first slot of i's block.
The module's memory blocks are static slot sets (a chunk starts at a block
boundary) and its causal rule compares positions; the two agree because
positions are consecutive along a chunk (the splash path's precondition,
splash_kernels.py). The 2D layout (memory blocks with flanges, causal or
bidirectional) has no splash rule here: it stays on the gathered XLA path.
"""

import jax

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import splash_kernels
from longformer_jax.attention.core.splash_kernels import BlockLocal


def kernel_pattern(model, section) -> backends.KernelPattern:
  """What an Image Transformer local layer asks of a kernel (config checks)."""
  right = 0 if model.causal else None           # the envelope: causal looks back only
  if section.layout != '1d':
    return backends.KernelPattern(right=right, dense_mask_ok=False,
                                  unsupported='the Image Transformer local 2D memory blocks')
  return backends.KernelPattern(right=right, dense_mask_ok=False,
                                splash_only='the Image Transformer local 1D memory blocks')


def image_local_1d_splash(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                          valid: jax.Array, *, query_len: int, memory_len: int,
                          causal: bool = True, interpret=None, kernel=None) -> jax.Array:
  """Local 1D attention within one chunk through the splash kernel.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    segment_ids, valid: `[batch, n]`; positions must be consecutive along the chunk.
    query_len, memory_len: `ImageLocalConfig.query_len`, `.memory_len`.
    causal: the shared `model.causal` (False: memory on both sides, no causal mask).
    interpret: Pallas interpret mode (None: off on TPU only).
    kernel: the masked-attention kernel (default splash; `block_sparse_flash.block_sparse_attention`
      on a GPU).
  Returns:
    `[batch, n, heads, head_dim]` in q's dtype.
  """
  return (kernel or splash_kernels.splash_attention)(
      q, k, v, segment_ids, valid, mask=BlockLocal(query_len, memory_len, causal),
      interpret=interpret)

"""cuDNN flash attention (`jax.nn.dot_product_attention(..., implementation='cudnn')`).

`cudnn_attention(q, k, v, mask, ...)` computes what `dot_product.attend`
computes with the same boolean `mask [batch, q, k]` (a function of positions,
docs/design.md contract 2: documents, padding, causal, window):

- the mask reaches cuDNN as its bias (`mask` argument, 0 / large negative),
  so documents starting inside a chunk and padding are exact;
- `causal` and `window` (keys at offsets `-window..0`, the Longformer's
  one-sided causal window; cuDNN's sliding window is causal only) are passed
  as cuDNN's own causal mask and sliding window as well, so cuDNN skips the
  blocks they exclude; they must agree with `mask` (which they do when
  query and key slots hold consecutive positions, as in a chunk);
- a query with no allowed key gives 0, like the dense reference (cuDNN would
  average the masked keys); its output, and so its gradient, is cut by a
  `where` on the mask's row-any.

cuDNN takes bfloat16 or float16: inputs are cast to bfloat16 (the variants
call this path only with `model.dtype='bfloat16'`, where they already are).
`implementation='xla'` runs the same call through XLA: the CPU tests use it
to check this wrapper's argument plumbing; the GPU test compares 'cudnn'.
"""

from typing import Optional

import jax
import jax.numpy as jnp


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
                    scale: float, causal: bool, window: Optional[int] = None,
                    implementation: str = 'cudnn') -> jax.Array:
  """Masked softmax attention through cuDNN.

  Args:
    q: `[batch, q, heads, head_dim]`, unscaled.
    k, v: `[batch, k, heads, head_dim]`.
    mask: `[batch, q, k]` bool, True where the query may attend to the key.
    scale: logits are `scale * q . k`.
    causal: also apply cuDNN's causal mask (query slot i sees key slots <= i;
      needs q and k of the same length).
    window: causal sliding window, keys at slot offsets `-window..0` (None: none).
    implementation: 'cudnn', or 'xla' for the reference run of the same call.
  Returns:
    `[batch, q, heads, head_dim]` bfloat16; rows with no allowed key are 0.
  """
  if window is not None and not causal:
    raise ValueError('cuDNN sliding windows are causal only')
  cast = lambda a: a.astype(jnp.bfloat16)
  out = jax.nn.dot_product_attention(
      cast(q), cast(k), cast(v), mask=mask[:, None], scale=scale, is_causal=causal,
      local_window_size=None if window is None else (window, 0),
      implementation=implementation)
  has_key = jnp.any(mask, axis=-1)[:, :, None, None]
  return jnp.where(has_key, out, jnp.zeros_like(out))

"""Softmax attention over a part of the keys, and the exact merge of parts.

Longformer's local queries attend jointly to their sliding window and to the
global tokens; the blocked window kernel computes the window part, the global
tokens are a second part. Each part returns its own normalised output and
its float32 log-sum-exp; `merge_parts` combines them into the softmax over
the union of the keys (the same rescaling as in online softmax / flash
attention). Fully masked rows give zeros, never NaN, and the gradients of the
merged result are those of one softmax over all the keys.
"""

from typing import Sequence

import jax
import jax.numpy as jnp


def _finite_or_zero(x: jax.Array) -> jax.Array:
  return jnp.where(jnp.isfinite(x), x, 0.0)


def softmax_part(logits: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Float32 softmax weights over the last axis and their log-sum-exp.

  Args:
    logits: `[..., q, k]` any float dtype.
    mask: bool, broadcastable to `logits`.
  Returns:
    `(weights [..., q, k] float32, lse [..., q] float32)`; a row with no
    allowed key has weights 0 and lse -inf.
  """
  logits = jnp.where(mask, logits.astype(jnp.float32), -jnp.inf)
  # Shift by the row max (0 for fully masked rows: exp(-inf) = 0, no NaN).
  row_max = jax.lax.stop_gradient(_finite_or_zero(jnp.max(logits, axis=-1, keepdims=True)))
  unnormalised = jnp.exp(logits - row_max)
  total = jnp.sum(unnormalised, axis=-1, keepdims=True)
  has_keys = total > 0
  safe_total = jnp.where(has_keys, total, 1.0)
  lse = jnp.where(has_keys, row_max + jnp.log(safe_total), -jnp.inf)
  return unnormalised / safe_total, lse[..., 0]


def merge_parts(outputs: Sequence[jax.Array], lses: Sequence[jax.Array]) -> jax.Array:
  """Softmax attention over the union of the parts' keys.

  Args:
    outputs: each `[b, q, h, d]`, a part's output normalised over its own keys.
    lses: each `[b, q, h]` float32, that part's log-sum-exp (-inf: no keys).
  Returns:
    `[b, q, h, d]` float32: sum_i exp(lse_i - lse) out_i with lse the
    log-sum-exp over all parts; 0 where no part has a key.
  """
  if len(outputs) == 1:
    return outputs[0].astype(jnp.float32)
  top = jax.lax.stop_gradient(_finite_or_zero(jnp.max(jnp.stack(lses), axis=0)))
  scales = [jnp.exp(lse - top) for lse in lses]
  total = sum(scales)
  safe_total = jnp.where(total > 0, total, 1.0)
  merged = sum(scale[..., None] * out.astype(jnp.float32) for scale, out in zip(scales, outputs))
  return merged / safe_total[..., None]

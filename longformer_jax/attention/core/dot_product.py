"""Masked softmax attention, the numerically careful core shared by variants."""

import jax
import jax.numpy as jnp


def masked_softmax(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Softmax over the last axis in float32; fully masked rows give zeros.

  Args:
    logits: `[batch, heads, q, k]` any float dtype.
    mask: `[batch, q, k]` or `[batch, heads, q, k]` bool.
  Returns:
    float32 weights of the logits' shape; rows with no allowed key are 0,
    not NaN.
  """
  if mask.ndim == logits.ndim - 1:
    mask = mask[:, None]
  logits = jnp.where(mask, logits.astype(jnp.float32), -jnp.inf)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  # A fully masked row has max -inf: shift it by 0 instead, so that every
  # entry is exp(-inf) = 0 and the row sums to 0 (no NaN from -inf - -inf).
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  unnormalised = jnp.exp(logits - jax.lax.stop_gradient(row_max))
  total = jnp.sum(unnormalised, axis=-1, keepdims=True)
  return unnormalised / jnp.where(total > 0, total, 1.0)


def attend(logits: jax.Array, mask: jax.Array, values: jax.Array) -> jax.Array:
  """Weights from `logits [b, h, q, k]` applied to `values [b, k, h, d]` -> `[b, q, h, d]`."""
  weights = masked_softmax(logits, mask)
  return jnp.einsum('bhqk,bkhd->bqhd', weights.astype(values.dtype), values)


def soft_masked_softmax(logits: jax.Array, mask: jax.Array, soft_mask: jax.Array) -> jax.Array:
  """Softmax weights multiplied by a soft mask in [0, 1], then renormalised.

  a_ij = m_ij exp(s_ij) / sum_k m_ik exp(s_ik) (Sukhbaatar et al., 2019,
  eq. 3; Expire-Span uses the same form). `soft_mask` broadcasts against
  `logits [b, h, q, k]`; rows whose soft-masked weights are all 0 give 0.
  """
  weights = masked_softmax(logits, mask) * soft_mask.astype(jnp.float32)
  total = jnp.sum(weights, axis=-1, keepdims=True)
  return weights / jnp.where(total > 0, total, 1.0)

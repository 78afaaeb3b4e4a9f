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


# Logits more than this many nats above the shift of `soft_masked_softmax` are capped.
SOFT_MASK_CAP = 60.0


def soft_masked_softmax(logits: jax.Array, mask: jax.Array, soft_mask: jax.Array) -> jax.Array:
  """Softmax weights multiplied by a soft mask in [0, 1], renormalised, in float32.

  a_ij = m_ij exp(s_ij) / sum_k m_ik exp(s_ik) over the keys allowed by `mask`
  (Sukhbaatar et al., 2019, eq. 3; Expire-Span uses the same form), computed
  as e_ij = m_ij exp(min(s_ij - c_i, CAP)) / sum_k e_ik with the constant
  shift c_i = max of s_ik + log m_ik over allowed keys with m_ik > 0 and
  CAP = `SOFT_MASK_CAP` (60). The kept key at c_i gives e = 1, so the sum is
  at least 1: nothing is renormalised from an underflow, whatever the spread.

  Exact (weights and their gradients with respect to logits and to m, the
  m = 0 corner keys included) for every row in which no allowed key's logit
  lies more than CAP nats above c_i. Beyond that, the keys above the cap get
  weight and m-gradient as if they lay CAP above c_i (their logit gradient is
  0): bounded and finite. Rows with no allowed key, or whose allowed keys all
  have m = 0, give 0 (finite gradients).

  Args:
    logits: `[b, h, q, k]` any float dtype.
    mask: `[b, q, k]` or `[b, h, q, k]` bool, the keys allowed.
    soft_mask: m in [0, 1], broadcasting against `[b, h, q, k]`.
  Returns:
    float32 weights `[b, h, q, k]`.
  """
  if mask.ndim == logits.ndim - 1:
    mask = mask[:, None]
  logits = logits.astype(jnp.float32)
  soft = jnp.broadcast_to(soft_mask.astype(jnp.float32), logits.shape)
  mask = jnp.broadcast_to(mask, logits.shape)
  kept = mask & (soft > 0)
  shift = jnp.max(jnp.where(kept, logits + jnp.log(jnp.where(kept, soft, 1.0)), -jnp.inf),
                  axis=-1, keepdims=True)
  shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
  exponent = jnp.minimum(jnp.where(mask, logits - shift, -jnp.inf), SOFT_MASK_CAP)
  weights = soft * jnp.exp(exponent)
  total = jnp.sum(weights, axis=-1, keepdims=True)
  return weights / jnp.where(total > 0, total, 1.0)

"""core/dot_product.soft_masked_softmax (Adaptive-Span, Expire-Span) at extreme logit spreads.

Against a float64 reference of a_ij = m_ij e^{s_ij} / sum_k m_ik e^{s_ik}:
weights and gradients (logits and soft mask, the m = 0 keys included; analytic float64
gradients) agree
where no allowed key lies more than `SOFT_MASK_CAP` nats above the shift;
where every key with m > 0 lies 300 nats below a key with m = 0, the weights
still agree and every gradient is finite.
"""

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core.dot_product import soft_masked_softmax

PROJECTION = np.arange(1.0, 7.0)          # a fixed readout of the 6 keys' weights


def reference(logits, mask, soft):
  """float64 numpy weights `[b, h, q, k]` of the formula (shifted by the allowed max)."""
  logits, soft = np.asarray(logits, np.float64), np.asarray(soft, np.float64)
  mask = np.broadcast_to(mask, logits.shape)
  shift = np.max(np.where(mask, logits, -np.inf), -1, keepdims=True)
  e = np.where(mask, soft * np.exp(logits - shift), 0.0)
  total = e.sum(-1, keepdims=True)
  return e / np.where(total > 0, total, 1.0)


def reference_grads(logits, mask, soft):
  """float64 gradients of `sum(weights * PROJECTION)` wrt logits and soft mask.

  L = sum_j P_j e_j / T: dL/de_k = (P_k - L) / T, de_k/ds_k = e_k,
  de_k/dm_k = exp(s_k - shift) on allowed keys (m_k = 0 included), 0 elsewhere.
  """
  logits, soft = np.asarray(logits, np.float64), np.asarray(soft, np.float64)
  mask = np.broadcast_to(mask, logits.shape)
  shift = np.max(np.where(mask, logits, -np.inf), -1, keepdims=True)
  unit = np.where(mask, np.exp(logits - shift), 0.0)
  e = soft * unit
  total = e.sum(-1, keepdims=True)
  loss = (e * PROJECTION).sum(-1, keepdims=True) / total
  de = (PROJECTION - loss) / total
  return [e * de, unit * de]


def inputs(spread: float):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(1, 1, 3, 6)) * 3.0
  soft = np.clip(rng.random((1, 1, 3, 6)) * 1.6 - 0.3, 0.0, 1.0)
  soft[..., 0] = 0.0                      # key 0: outside the span (m = 0) ...
  soft[..., 1] = 1.0
  logits[..., 0] += spread                # ... and `spread` nats above the rest
  mask = np.ones((1, 3, 6), bool)
  mask[0, 2, 5] = False
  return logits, mask, soft


def grads(logits, mask, soft):
  loss = lambda s, m: jnp.sum(soft_masked_softmax(s, jnp.asarray(mask), m) * PROJECTION)
  return [np.asarray(g) for g in jax.grad(loss, argnums=(0, 1))(
      jnp.asarray(logits, jnp.float32), jnp.asarray(soft, jnp.float32))]


def test_exact_with_gradients_at_m_zero_keys_within_the_cap():
  logits, mask, soft = inputs(spread=20.0)
  got = np.asarray(soft_masked_softmax(jnp.asarray(logits, jnp.float32), jnp.asarray(mask),
                                       jnp.asarray(soft, jnp.float32)))
  np.testing.assert_allclose(got, reference(logits, mask[:, None], soft), rtol=1e-5, atol=1e-7)
  for g, want in zip(grads(logits, mask, soft), reference_grads(logits, mask[:, None], soft)):
    np.testing.assert_allclose(g, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
  # The m = 0 key's soft-mask gradient is e^{s_0 - c} / total: large, not 0.
  assert (np.abs(grads(logits, mask, soft)[1][..., 0]) > 1e3).all()


def test_finite_when_every_kept_key_lies_300_nats_below_a_dropped_one():
  logits, mask, soft = inputs(spread=300.0)
  got = np.asarray(soft_masked_softmax(jnp.asarray(logits, jnp.float32), jnp.asarray(mask),
                                       jnp.asarray(soft, jnp.float32)))
  np.testing.assert_allclose(got, reference(logits, mask[:, None], soft), rtol=1e-5, atol=1e-7)
  for g in grads(logits, mask, soft):
    assert np.isfinite(g).all()
  # Logit gradients of the kept keys are still those of the formula (key 0 has weight 0).
  want = reference_grads(logits, mask[:, None], soft)[0]
  np.testing.assert_allclose(grads(logits, mask, soft)[0][..., 1:], want[..., 1:],
                             rtol=1e-3, atol=1e-4)

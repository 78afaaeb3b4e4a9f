"""Reformer LSH chunk attention, one scan step per group of sorted chunks.

The rows (query/key slots) are already sorted by (round, bucket, position)
and laid out *step-major*: `[steps, batch', G * m, ...]` (batch' = batch x
heads, G chunks of m rows per step). Query chunk c attends to the keys of
chunk c and c - 1 (the previous one only when `has_previous(c)`, i.e. not the
first chunk of a hash round), masked by: same bucket, causal / document /
padding rule of `masking.causal_document_mask`, and the self key's logit
replaced by `SELF_LOGIT` (attention/lsh/attention.py's module docstring).

Step s holds the `[batch', G, m, 2m]` scores of its G chunks only (they stay
in cache); the backward pass recomputes them (FlashAttention, Dao et al.,
2022, alg. 2) instead of storing them. It scans the steps in reverse so that
the key gradients of a step's first chunk's *previous* chunk (the last chunk
of step s - 1) travel in the carry, and every step writes its own chunks'
key/value gradients whole.

Outputs `(out [steps, b', G * m, d], lse [steps, b', G * m])`: each sorted
row's softmax output over its candidates and the float32 log-sum-exp (-inf
and output 0 for a row with no allowed key), for merging the hash rounds.
"""

import functools

import jax
import jax.numpy as jnp

from longformer_jax.attention.core.masking import causal_document_mask


def _previous_chunks(x: jax.Array, first_prev: jax.Array, m: int) -> jax.Array:
  """Own chunks `[b', G * m, ...]` and the step's previous chunk `[b', m, ...]` -> previous
  chunk of each own chunk, `[b', G * m, ...]`."""
  return jnp.concatenate([first_prev, x[:, :-m]], axis=1)


def _step_logits(settings, step, q, k, facts, first_prev):
  """`(logits [b', G, m, 2m] float32 masked, k [b', G, 2m, d], v, is_self)` of one step."""
  m, chunks_per_round, causal, scale, self_logit = settings
  s, q_s, k_s, v_s, (pos, seg, valid, bucket) = step, q, k[0], k[1], facts
  kp, vp, (ppos, pseg, pvalid, pbucket) = first_prev
  b, rows, d = q_s.shape
  g = rows // m

  def chunked(own, prev):   # -> [b', G, 2m, ...]: own chunk, then the previous one
    prev = _previous_chunks(own, prev, m)
    own = own.reshape(b, g, m, *own.shape[2:])
    prev = prev.reshape(b, g, m, *prev.shape[2:])
    return jnp.concatenate([own, prev], axis=2)

  keys, values = chunked(k_s, kp), chunked(v_s, vp)
  k_pos, k_seg, k_valid, k_bucket = (chunked(a, p) for a, p in
                                     ((pos, ppos), (seg, pseg), (valid, pvalid),
                                      (bucket, pbucket)))
  q_pos, q_seg, q_bucket = (a.reshape(b, g, m) for a in (pos, seg, bucket))
  queries = q_s.reshape(b, g, m, d)
  flat = lambda a: a.reshape(b * g, *a.shape[2:])  # noqa: E731
  allowed = causal_document_mask(flat(q_pos), flat(q_seg), flat(k_pos), flat(k_seg),
                                 flat(k_valid), causal=causal).reshape(b, g, m, 2 * m)
  allowed &= q_bucket[..., :, None] == k_bucket[..., None, :]
  chunk = s * g + jnp.arange(g)
  has_previous = (chunk % chunks_per_round) > 0                               # [G]
  key_is_own = jnp.arange(2 * m) < m
  allowed &= (key_is_own[None, :] | has_previous[:, None])[None, :, None, :]
  is_self = ((q_pos[..., :, None] == k_pos[..., None, :])
             & (q_seg[..., :, None] == k_seg[..., None, :]))
  logits = jnp.einsum('bgqd,bgkd->bgqk', queries, keys, preferred_element_type=jnp.float32)
  if scale is not None:
    logits = logits / scale
  logits = jnp.where(is_self, self_logit, logits)
  return jnp.where(allowed, logits, -jnp.inf), keys, values, is_self


def _first_prev(k, v, facts, m):
  """The chunk before each step's first chunk: the last chunk of the step before (zeros and
  invalid for step 0, which is a round's first chunk anyway)."""
  def shifted(x):
    last = x[:-1, :, -m:]
    return jnp.concatenate([jnp.zeros_like(x[:1, :, -m:]), last], axis=0)
  return shifted(k), shifted(v), tuple(shifted(f) for f in facts)


def _forward(settings, q, k, v, facts):
  m = settings[0]
  first = _first_prev(k, v, facts, m)

  def step_fn(_, xs):
    s, q_s, k_s, v_s, f_s, kp, vp, fp = xs
    logits, _, values, _ = _step_logits(settings, s, q_s, (k_s, v_s), f_s, (kp, vp, fp))
    top = jnp.max(logits, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    unnormalised = jnp.exp(logits - top)
    total = jnp.sum(unnormalised, axis=-1, keepdims=True)
    nonempty = total > 0
    safe_total = jnp.where(nonempty, total, 1.0)
    lse = jnp.where(nonempty, jnp.log(safe_total) + top, -jnp.inf)[..., 0]
    out = jnp.einsum('bgqk,bgkd->bgqd', unnormalised, values.astype(jnp.float32),
                     preferred_element_type=jnp.float32) / safe_total
    b, g = out.shape[:2]
    return None, (out.reshape(b, g * m, -1), lse.reshape(b, g * m))

  steps = q.shape[0]
  _, (out, lse) = jax.lax.scan(step_fn, None, (jnp.arange(steps), q, k, v, facts, *first))
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def lsh_chunk_attention(settings: tuple, q: jax.Array, k: jax.Array, v: jax.Array,
                        facts: tuple) -> tuple[jax.Array, jax.Array]:
  """Attention of each sorted chunk over itself and the previous chunk (module docstring).

  Args:
    settings: static `(m, chunks_per_round, causal, scale or None, self_logit)`;
      logits are `q . k / scale`.
    q, k, v: `[steps, b', G * m, d]` sorted rows, step-major.
    facts: `(positions, segments, valid, buckets)`, each `[steps, b', G * m]`.
  Returns:
    `(out [steps, b', G * m, d], lse [steps, b', G * m])`, both float32.
  """
  return _forward(settings, q, k, v, facts)


def _fwd(settings, q, k, v, facts):
  out, lse = _forward(settings, q, k, v, facts)
  return (out, lse), (q, k, v, facts, out, lse)


def _bwd(settings, residuals, cotangents):
  q, k, v, facts, out, lse = residuals
  d_out, d_lse = cotangents
  m, scale = settings[0], settings[3]
  first = _first_prev(k, v, facts, m)
  row_dot = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  correction_all = row_dot - d_lse                                           # [steps, b', rows]

  def step_fn(carry, xs):
    d_k_next, d_v_next = carry             # gradients of this step's last chunk from step s + 1
    s, q_s, k_s, v_s, f_s, kp, vp, fp, lse_s, d_out_s, corr_s = xs
    logits, keys, values, is_self = _step_logits(settings, s, q_s, (k_s, v_s), f_s,
                                                 (kp, vp, fp))
    b, g = logits.shape[:2]
    shift = jnp.where(jnp.isfinite(lse_s), lse_s, 0.0).reshape(b, g, m, 1)
    weights = jnp.exp(logits - shift)
    d_out_c = d_out_s.astype(jnp.float32).reshape(b, g, m, -1)
    d_weights = jnp.einsum('bgqd,bgkd->bgqk', d_out_c, values.astype(jnp.float32))
    d_logits = weights * (d_weights - corr_s.reshape(b, g, m, 1))
    d_logits = jnp.where(is_self, 0.0, d_logits)
    if scale is not None:
      d_logits = d_logits / scale
    queries = q_s.reshape(b, g, m, -1).astype(jnp.float32)
    d_q = jnp.einsum('bgqk,bgkd->bgqd', d_logits, keys.astype(jnp.float32))
    d_keys = jnp.einsum('bgqk,bgqd->bgkd', d_logits, queries)
    d_values = jnp.einsum('bgqk,bgqd->bgkd', weights, d_out_c)

    def own_total(d, d_next):   # [b', G, 2m, d] -> own chunks' totals [b', G*m, d], carry out
      own, prev = d[:, :, :m], d[:, :, m:]
      shifted = jnp.concatenate([prev[:, 1:], d_next[:, None]], axis=1)
      return (own + shifted).reshape(b, g * m, -1), prev[:, 0]

    d_k, d_k_first = own_total(d_keys, d_k_next)
    d_v, d_v_first = own_total(d_values, d_v_next)
    return (d_k_first, d_v_first), (d_q.reshape(b, g * m, -1).astype(q.dtype),
                                     d_k.astype(k.dtype), d_v.astype(v.dtype))

  steps, b, _, d = q.shape
  zeros = (jnp.zeros((b, m, d), jnp.float32),) * 2
  _, (d_q, d_k, d_v) = jax.lax.scan(
      step_fn, zeros, (jnp.arange(steps), q, k, v, facts, *first, lse, d_out, correction_all),
      reverse=True)
  return d_q, d_k, d_v, None


lsh_chunk_attention.defvjp(_fwd, _bwd)

"""Attention of query blocks over a few key spans each, one scan step at a time.

The blocked Sparse Transformer and BigBird paths used to build every query
block's scores `[batch, heads, num_blocks, block, keys]` for the whole chunk
at once (block_sparse.py). Here a `lax.scan` walks the query blocks instead,
as the sliding-window kernel does (sliding_window.py): step j holds the
`[batch, heads, Q, keys]` scores of one query block of Q slots only, so they
stay in cache, and the backward pass recomputes them (FlashAttention-style,
Dao et al., 2022, alg. 2) instead of storing them.

The keys of step j are a few *spans*: contiguous slices of static length of
a heads-major key array, starting at a per-step slot (`starts [steps,
spans]`, e.g. the previous blocks, a random block, a prefix of gathered
summary or global keys). Which keys of a span a query attends to is decided
from position facts only: same document, a real key, and the span's
`allows(q_rel, k_rel)` rule. The spans of one step must be disjoint in what
they allow (as block_sparse's key sets); one softmax runs over all of them.
Static span lengths let a pattern cut wasted work by calling the kernel once
per *segment* of steps with the same geometry (e.g. a shorter span for the
first query block of every Sparse Transformer block).

Shapes: q `[steps, batch, heads, Q, d]` (already scaled), queries' relative
positions and documents `[steps, batch, Q]`; key/value pairs heads-major
`[batch, heads, L, d]`; key facts `(rel, segments, valid)` `[batch, L]`.
Outputs `(out [steps, batch, heads, Q, d], lse [steps, batch, heads, Q])`:
the softmax output over the step's spans and its float32 log-sum-exp (-inf
for a query with no allowed key, whose output is 0), so that other key sets
can be merged in exactly (partial_softmax.merge_parts).

A start must leave the whole span inside its array (`dynamic_slice` would
clamp it silently): callers pad the arrays.
"""

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Span:
  """One key span of every step (static)."""
  kv: int                               # which (k, v) pair the keys are sliced from
  facts: int                            # which (rel, segments, valid) facts describe them
  length: int                           # keys in the span
  allows: Callable[[jax.Array, jax.Array], jax.Array]   # (q_rel, k_rel) -> bool, broadcasting


@dataclasses.dataclass(frozen=True)
class ScanGeometry:
  spans: tuple                          # of Span
  unroll: int = 2                       # lax.scan unroll: steps per compiled loop iteration


def _slice(x: jax.Array, start: jax.Array, length: int, axis: int) -> jax.Array:
  return jax.lax.dynamic_slice_in_dim(x, start, length, axis=axis)


def _span_logits(geometry, step, q_steps, q_facts, kvs, facts):
  """Per span: `(logits [b, h, Q, len] float32, -inf where masked; k; v)` of step `step`."""
  j, starts = step
  q, (q_rel, q_seg) = q_steps[j], (q_facts[0][j], q_facts[1][j])           # [b, h, Q, d], [b, Q]
  pieces = []
  for s, span in enumerate(geometry.spans):
    start = starts[s]
    k, v = (_slice(x, start, span.length, 2) for x in kvs[span.kv])        # [b, h, len, d]
    k_rel, k_seg, k_valid = (_slice(x, start, span.length, 1) for x in facts[span.facts])
    mask = (k_valid[:, None, :] & (q_seg[:, :, None] == k_seg[:, None, :])
            & span.allows(q_rel[:, :, None], k_rel[:, None, :]))             # [b, Q, len]
    logits = jnp.einsum('bhqd,bhkd->bhqk', q, k, preferred_element_type=jnp.float32)
    pieces.append((jnp.where(mask[:, None], logits, -jnp.inf), k, v))
  return pieces


def _scan(geometry, body, carry, starts):
  steps = starts.shape[0]
  return jax.lax.scan(body, carry, (jnp.arange(steps), starts),
                      unroll=max(1, min(geometry.unroll, steps)))


def _forward(geometry, q_steps, q_facts, starts, kvs, facts):
  def step_fn(_, step):
    pieces = _span_logits(geometry, step, q_steps, q_facts, kvs, facts)
    row_max = functools.reduce(jnp.maximum, [jnp.max(l, axis=-1, keepdims=True)
                                             for l, _, _ in pieces])
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)   # fully masked rows: exp(-inf) = 0
    total, out = 0.0, 0.0
    for logits, _, v in pieces:
      unnormalised = jnp.exp(logits - row_max)
      total = total + jnp.sum(unnormalised, axis=-1, keepdims=True)
      out = out + jnp.einsum('bhqk,bhkd->bhqd', unnormalised.astype(v.dtype), v,
                             preferred_element_type=jnp.float32)
    safe_total = jnp.where(total > 0, total, 1.0)
    lse = jnp.where(total > 0, row_max + jnp.log(safe_total), -jnp.inf)[..., 0]
    return None, ((out / safe_total).astype(q_steps.dtype), lse)
  _, (out, lse) = _scan(geometry, step_fn, None, starts)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def span_attention(geometry: ScanGeometry, q_steps: jax.Array, q_facts: tuple, starts: jax.Array,
                   kvs: tuple, facts: tuple) -> tuple[jax.Array, jax.Array]:
  """Softmax attention of each step's query block over its spans (module docstring).

  Args:
    geometry: the static spans.
    q_steps: `[steps, b, h, Q, d]` (already scaled).
    q_facts: `(rel, segments)`, each `[steps, b, Q]` int.
    starts: `[steps, len(spans)]` int32, each span's first slot in its array.
    kvs: tuple of `(k, v)`, each heads-major `[b, h, L, d]`.
    facts: tuple of `(rel, segments, valid)`, each `[b, L]`.
  Returns:
    `(out [steps, b, h, Q, d] in q's dtype, lse [steps, b, h, Q] float32)`.
  """
  return _forward(geometry, q_steps, q_facts, starts, kvs, facts)


def _span_attention_fwd(geometry, q_steps, q_facts, starts, kvs, facts):
  out, lse = _forward(geometry, q_steps, q_facts, starts, kvs, facts)
  return (out, lse), (q_steps, q_facts, starts, kvs, facts, out, lse)


def _span_attention_bwd(geometry, residuals, cotangents):
  q_steps, q_facts, starts, kvs, facts, out, lse = residuals
  d_out, d_lse = cotangents
  d_out = d_out.astype(jnp.float32)
  # rowsum(dO * O) = rowsum(dP * P) (O = P V): a [Q, d] reduction per step.
  row_dot = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)              # [steps, b, h, Q]

  def step_fn(d_kvs, step):
    j, step_starts = step
    pieces = _span_logits(geometry, step, q_steps, q_facts, kvs, facts)
    step_lse = lse[j]
    shift = jnp.where(jnp.isfinite(step_lse), step_lse, 0.0)[..., None]
    d_out_j = d_out[j]
    correction = (row_dot[j] - d_lse[j])[..., None]
    q_j = q_steps[j]
    d_q = 0.0
    d_kvs = [list(pair) for pair in d_kvs]
    for s, (span, (logits, k, v)) in enumerate(zip(geometry.spans, pieces)):
      weights = jnp.exp(logits - shift)
      d_weights = jnp.einsum('bhqd,bhkd->bhqk', d_out_j.astype(v.dtype), v,
                             preferred_element_type=jnp.float32)
      d_logits = (weights * (d_weights - correction)).astype(q_j.dtype)
      d_q = d_q + jnp.einsum('bhqk,bhkd->bhqd', d_logits, k, preferred_element_type=jnp.float32)
      d_k = jnp.einsum('bhqk,bhqd->bhkd', d_logits, q_j, preferred_element_type=jnp.float32)
      d_v = jnp.einsum('bhqk,bhqd->bhkd', weights.astype(v.dtype), d_out_j.astype(v.dtype),
                       preferred_element_type=jnp.float32)
      start = step_starts[s]
      for which, part in ((0, d_k), (1, d_v)):
        total = d_kvs[span.kv][which]
        d_kvs[span.kv][which] = jax.lax.dynamic_update_slice_in_dim(
            total, _slice(total, start, span.length, 2) + part, start, axis=2)
    return tuple(tuple(pair) for pair in d_kvs), d_q.astype(q_steps.dtype)

  zeros = tuple(tuple(jnp.zeros(x.shape, jnp.float32) for x in pair) for pair in kvs)
  d_kvs, d_q = _scan(geometry, step_fn, zeros, starts)
  d_kvs = tuple(tuple(d.astype(x.dtype) for d, x in zip(dp, p)) for dp, p in zip(d_kvs, kvs))
  return d_q, None, None, d_kvs, None


span_attention.defvjp(_span_attention_fwd, _span_attention_bwd)


def heads_major(x: jax.Array) -> jax.Array:
  """`[b, L, h, d] -> [b, h, L, d]`."""
  return jnp.swapaxes(x, 1, 2)


def steps_of(x: jax.Array, q_len: int) -> jax.Array:
  """`[b, steps * Q, ...] -> [steps, b, Q, ...]` (query slots grouped per step)."""
  b, n = x.shape[:2]
  return jnp.swapaxes(x.reshape(b, n // q_len, q_len, *x.shape[2:]), 0, 1)


def q_steps_of(q: jax.Array, q_len: int) -> jax.Array:
  """`[b, steps * Q, h, d] -> [steps, b, h, Q, d]`."""
  return jnp.swapaxes(steps_of(q, q_len), 2, 3)


def from_q_steps(out: jax.Array) -> jax.Array:
  """`[steps, b, h, Q, d] -> [b, steps * Q, h, d]`."""
  steps, b, h, q_len, d = out.shape
  return jnp.transpose(out, (1, 0, 3, 2, 4)).reshape(b, steps * q_len, h, d)


def from_lse_steps(lse: jax.Array) -> jax.Array:
  """`[steps, b, h, Q] -> [b, steps * Q, h]`."""
  steps, b, h, q_len = lse.shape
  return jnp.transpose(lse, (1, 0, 3, 2)).reshape(b, steps * q_len, h)

"""The two-sided sliding window (the encoder Longformer's) as two causal cuDNN windows.

cuDNN's sliding window is causal only. A query at slot i of a two-sided window
w attends to keys i - w .. i + w of its document; that is the union of

- the *left* part, keys i - w .. i: the causal window of `cudnn_window.py`;
- the *right* part, keys i + 1 .. i + w: on the sequence reversed along its
  slots (reversed token t' = n - 1 - t), these are the w keys strictly before
  the query. A causal window includes the query's own slot, so the reversed
  queries are shifted by one slot: slot t' holds the query of reversed token
  t' + 1, whose causal window of w - 1 over slots t' - (w - 1) .. t' is then
  exactly reversed tokens (t' + 1) - w .. (t' + 1) - 1. The query moved into
  the last slot of a run belongs to the next document (or is padding): its row
  is dropped, and the first token of each reversed run has an empty right
  part, as it should (it is its document's last token).

The two parts are disjoint, so their outputs merge exactly by their
log-sum-exps (`partial_softmax.merge_parts`), whose gradients
`cudnn_window`'s custom VJP provides. Documents and padding are packed as in
`cudnn_window.py` (reversed ids are negated, so they still rise along the
slots); batches that do not `fit` run the caller's fallback. The cost is two
log-sum-exp passes, each about twice a plain cuDNN window call.
"""

import jax
import jax.numpy as jnp

from longformer_jax.attention.core import cudnn_window
from longformer_jax.attention.core.partial_softmax import merge_parts


def _reverse(a: jax.Array) -> jax.Array:
  return jnp.flip(a, axis=1)


def _log_add(a: jax.Array, b: jax.Array) -> jax.Array:
  """log(e^a + e^b) with -inf where both are -inf (no NaN value or gradient there)."""
  top = jax.lax.stop_gradient(jnp.maximum(a, b))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  total = jnp.exp(a - top) + jnp.exp(b - top)
  return jnp.where(total > 0, top + jnp.log(jnp.where(total > 0, total, 1.0)), -jnp.inf)


def two_sided_window_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                               segment_ids: jax.Array, valid: jax.Array, *, window: int,
                               scale: float, fallback: cudnn_window.Fallback,
                               implementation: str = 'cudnn',
                               max_segments: int = cudnn_window.MAX_SEGMENTS):
  """Keys at positions `p - window .. p + window` of the query's document -> `(out, lse)`.

  Shapes and arguments as `cudnn_window.window_attention` (query i at key slot
  i); returns `out [batch, n, heads, head_dim]` float32 and `lse [batch, n,
  heads]` float32 (0 and -inf on padding rows).
  """
  settings = dict(scale=scale, with_lse=True, implementation=implementation,
                  max_segments=max_segments)

  def fast(q, k, v):
    left, left_lse = cudnn_window.fitted_window_attention(
        q, k, v, segment_ids, valid, window=window, **settings)
    # Right part: reversed slots, queries shifted one slot towards the front.
    seg_r, valid_r = -_reverse(segment_ids), _reverse(valid)
    q_r = _reverse(q)
    q_shifted = jnp.concatenate([q_r[:, 1:], jnp.zeros_like(q_r[:, :1])], axis=1)
    right, right_lse = cudnn_window.fitted_window_attention(
        q_shifted, _reverse(k), _reverse(v), seg_r, valid_r, window=window - 1, **settings)
    # Row t' answers reversed token t' + 1 when both are valid slots of one document.
    same_doc = valid_r[:, :-1] & valid_r[:, 1:] & (seg_r[:, :-1] == seg_r[:, 1:])
    keep = same_doc[:, :, None]
    right = jnp.where(keep[..., None], right[:, :-1], 0.0)
    right_lse = jnp.where(keep, right_lse[:, :-1], -jnp.inf)
    pad = lambda a, value: jnp.concatenate(
        [jnp.full_like(a[:, :1], value), a], axis=1)        # reversed token 0: no right part
    right, right_lse = _reverse(pad(right, 0.0)), _reverse(pad(right_lse, -jnp.inf))
    out = merge_parts([left, right], [left_lse, right_lse])
    return out, _log_add(left_lse, right_lse)

  def slow(q, k, v):
    out, lse = fallback(q, k, v)
    rows = valid[..., None]
    return (jnp.where(rows[..., None], out.astype(jnp.float32), 0.0),
            jnp.where(rows, lse.astype(jnp.float32), -jnp.inf))

  return jax.lax.cond(cudnn_window.fits(positions, segment_ids, valid, max_segments),
                      fast, slow, q, k, v)

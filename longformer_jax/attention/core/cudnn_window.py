"""Causal sliding-window attention through cuDNN, documents and padding as packed segments.

`window_attention(q, k, v, positions, segment_ids, valid, window=w, ...)`
computes, for every slot i of a sequence of `n` slots, softmax attention over
the keys j with

    valid[j],  segment_ids[j] == segment_ids[i],  positions[i] - w <= positions[j] <= positions[i]

(the Longformer's one-sided causal window of w + 1 keys, docs/design.md
contract 2), with cuDNN's fused flash attention and its sliding window, so
the cost is O(n·w) and no n x n array is built. cuDNN has no document ids: a
row's documents and padding reach it as packed segments (cuDNN's ragged
"THD" layout, `q_offsets` / `q_seqlen` of
`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`; Hopper or
newer): each maximal run of valid slots of one document is one sequence,
with its own causal mask and window, and padding slots belong to none.

That equals the rule on positions when, in every row, positions rise by one
from slot to slot inside a document, a document's valid slots are one run
(padding before or after them, as at a stream's start or a row's end, never
between), documents follow each other in id order, and there are at most
`max_segments` runs. `fits` checks this on the traced values; a batch that
does not fit runs `fallback` (the caller's blocked XLA kernel) through
`lax.cond`, so the layer stays exact on every input. A batch whose rows are
each one document followed by padding skips the packing (cuDNN's plain
padding mask, `q_seqlen [batch]`).

`with_lse=True` also returns the float32 log-sum-exp, for merging the window
with other parts (global tokens, attention sinks) by `partial_softmax.merge_parts`.
cuDNN returns its log-sum-exp without a gradient (the backward rule of
`fused_attention_stablehlo` drops that cotangent), so this path has its own
`custom_vjp`: with c the log-sum-exp's cotangent and s the scale,

    d lse_i / d q_i = s * sum_j P_ij k_j,      d lse_i / d k_j = s * P_ij q_i,

the first from a forward pass with values `[v, k]` (E_P[k] beside the
output), the second as the value gradient of a pass with values `[v, 0]` and
output cotangent `[d_out, s c q]`, whose query / key gradients are the
ordinary ones (the zero half adds nothing to them). Both passes run at twice
the head width (queries and keys zero-padded to the values' width), so the
path costs about twice the plain one.

`implementation='xla'` runs the same packed description through
`jax.nn.dot_product_attention(implementation='xla')` with the dense mask that
the offsets and lengths describe: the CPU tests check the packing, the
branch choice and the log-sum-exp gradient with it; tests/attention/test_cudnn_attention.py
compares 'cudnn' on a GPU.
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp

MAX_SEGMENTS = 16       # packed runs per row cuDNN is given; more runs take the fallback

Fallback = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _run_starts(segment_ids: jax.Array, valid: jax.Array) -> jax.Array:
  """`[batch, n]` bool: the slot starts a run of valid slots of one document."""
  new_id = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                            segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  prev_valid = jnp.concatenate([jnp.zeros_like(valid[:, :1]), valid[:, :-1]], axis=1)
  return valid & (new_id | ~prev_valid)


def packed_segments(segment_ids: jax.Array, valid: jax.Array, max_segments: int):
  """The valid runs of each row as cuDNN's packed segments.

  Args:
    segment_ids, valid: `[batch, n]`.
  Returns:
    `(offsets [batch, max_segments + 1], lengths [batch, max_segments], runs [batch])`
    int32: run m of a row starts at slot `offsets[m]` and holds `lengths[m]`
    slots; entries past the row's runs are -1 (cuDNN's convention); `runs`
    counts the row's valid runs (may exceed `max_segments`).
  """
  n = segment_ids.shape[1]
  starts = _run_starts(segment_ids, valid)                      # [b, n]
  run_of_slot = jnp.cumsum(starts, axis=1) - 1                  # valid run index per slot
  runs = jnp.sum(starts, axis=1).astype(jnp.int32)
  m = jnp.arange(max_segments + 1)
  in_run = (run_of_slot[:, None, :] == m[None, :, None]) & valid[:, None, :]   # [b, M+1, n]
  slot = jnp.arange(n)
  first = jnp.min(jnp.where(in_run, slot, n), axis=2)
  count = jnp.sum(in_run, axis=2)
  present = count > 0
  offsets = jnp.where(present, first, -1).astype(jnp.int32)
  lengths = jnp.where(present, count, -1)[:, :max_segments].astype(jnp.int32)
  offsets = offsets.at[:, max_segments].set(-1)
  return offsets, lengths, runs


def fits(positions: jax.Array, segment_ids: jax.Array, valid: jax.Array,
         max_segments: int = MAX_SEGMENTS) -> jax.Array:
  """Scalar bool: packed runs give exactly the position rule in every row (module docstring)."""
  same_doc = segment_ids[:, 1:] == segment_ids[:, :-1]
  both_valid = valid[:, 1:] & valid[:, :-1]
  consecutive = ~(same_doc & both_valid) | (positions[:, 1:] == positions[:, :-1] + 1)
  # Among valid slots, document ids never go back, and a document's valid slots are one run
  # (padding may precede or follow them, never split them: causal queries never reach it).
  last_seen = jax.lax.cummax(jnp.where(valid, segment_ids, jnp.iinfo(jnp.int32).min), axis=1)
  ordered = ~valid[:, 1:] | (segment_ids[:, 1:] >= last_seen[:, :-1])
  hole = valid[:, 1:] & ~valid[:, :-1] & (segment_ids[:, 1:] == last_seen[:, :-1])
  runs = jnp.sum(_run_starts(segment_ids, valid), axis=1)
  return (jnp.all(consecutive) & jnp.all(ordered) & ~jnp.any(hole) &
          jnp.all(runs <= max_segments))


def single_prefix_run(segment_ids: jax.Array, valid: jax.Array) -> jax.Array:
  """Scalar bool: every row is one document from slot 0, then padding only."""
  one_doc = jnp.all(~valid | (segment_ids == segment_ids[:, :1]), axis=1)
  prefix = valid[:, 0] & jnp.all(valid[:, 1:] <= valid[:, :-1], axis=1)
  return jnp.all(one_doc & prefix)


def packed_mask(offsets: jax.Array, lengths: jax.Array, n: int, window: int) -> jax.Array:
  """`[batch, n, n]` bool: what the packed description lets slot i attend (cuDNN's
  reading of it: same run, key not after the query, at most `window` slots back)."""
  slot = jnp.arange(n)
  ends = jnp.where(lengths >= 0, offsets[:, :-1] + lengths, -1)
  member = ((slot[None, None, :] >= offsets[:, :-1, None]) &
            (slot[None, None, :] < ends[:, :, None]))                  # [b, M, n]
  run = jnp.where(jnp.any(member, axis=1), jnp.argmax(member, axis=1), -1)
  distance = slot[:, None] - slot[None, :]
  same = (run[:, :, None] == run[:, None, :]) & (run[:, :, None] >= 0)
  return same & (distance >= 0) & (distance <= window)


def _cudnn_call(q, k, v, lengths, offsets, *, window, scale, packed, return_residual):
  # deferred: jax._src.cudnn, a private JAX module used only on GPUs: a JAX release that moves
  # it breaks this call, not importing the module
  from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=g-import-not-at-top
  kwargs = dict(q_offsets=offsets, kv_offsets=offsets) if packed else {}
  return fused.dot_product_attention(
      q, k, v, q_seqlen=lengths, kv_seqlen=lengths, scale=scale,
      mask_type=fused.MaskType.PADDING_CAUSAL, sliding_window_length=window + 1,
      return_residual=return_residual, **kwargs)


# cuDNN's softmax statistics of packed segments: one row per segment (the segments of all
# rows, in order, compacted), indexed by the token's offset within its segment.
PACKED_STATS_RELATIVE = True


def token_lse_from_packed_stats(stats: jax.Array, offsets: jax.Array,
                                lengths: jax.Array) -> jax.Array:
  """cuDNN's packed statistics `[batch * M, heads, n]` -> each slot's `[batch, n, heads]`."""
  batch, num = lengths.shape
  n = stats.shape[-1]
  present = lengths > 0
  before_row = jnp.cumsum(jnp.sum(present, axis=1)) - jnp.sum(present, axis=1)      # [b]
  slot = jnp.arange(n)
  starts = offsets[:, :num]
  member = (present[:, :, None] & (slot[None, None, :] >= starts[:, :, None]) &
            (slot[None, None, :] < (starts + lengths)[:, :, None]))                   # [b, M, n]
  run = jnp.argmax(member, axis=1)                                                    # [b, n]
  start = jnp.take_along_axis(starts, run, axis=1)
  row = jnp.clip(before_row[:, None] + run, 0, batch * num - 1)
  column = jnp.clip(slot[None, :] - start, 0, n - 1) if PACKED_STATS_RELATIVE else slot[None, :]
  return stats[row, :, column]                                                        # [b, n, h]


def covered_slots(offsets: jax.Array, lengths: jax.Array, n: int) -> jax.Array:
  """`[batch, n]` bool: the slot lies in one of the packed runs."""
  slot = jnp.arange(n)
  starts = offsets[:, :lengths.shape[1], None]
  return jnp.any((lengths[:, :, None] > 0) & (slot >= starts) &
                 (slot < starts + lengths[:, :, None]), axis=1)


@jax.custom_vjp
def _cotangent_only_where(x: jax.Array, keep: jax.Array) -> jax.Array:
  """Identity whose VJP zeroes the rows of `x [b, n, ...]` where `keep [b, n]` is False."""
  return x


def _cotangent_only_where_fwd(x, keep):
  return x, keep


def _cotangent_only_where_bwd(keep, g):
  return jnp.where(keep.reshape(keep.shape + (1,) * (g.ndim - 2)), g, jnp.zeros_like(g)), None


_cotangent_only_where.defvjp(_cotangent_only_where_fwd, _cotangent_only_where_bwd)


def _attend(q, k, v, offsets, lengths, *, window, scale, packed, implementation,
            return_lse=True):
  """One kernel call -> `(out [b, n, h, dv], lse [b, n, h] float32 or None)`; cuDNN takes
  bfloat16 (the 'xla' reference keeps the inputs' dtype, so the CPU tests compare at float32).

  Values wider than the keys (`dv = 2 * d`, the log-sum-exp passes) get zero-padded
  queries and keys: the same logits, and every cuDNN version takes equal widths.
  """
  # cuDNN leaves the gradients of slots outside every run unwritten (measured on an H100:
  # stray values in dq there); their true gradients are 0 (masked rows, unattended keys).
  covered = covered_slots(offsets, lengths, q.shape[1])
  q, k, v = (_cotangent_only_where(a, covered) for a in (q, k, v))
  if implementation == 'cudnn':
    q, k, v = (a.astype(jnp.bfloat16) for a in (q, k, v))
  extra = v.shape[-1] - q.shape[-1]
  if extra:
    pad = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, extra)))
    q, k = pad(q), pad(k)
  if implementation == 'cudnn':
    result = _cudnn_call(q, k, v, lengths if packed else lengths[:, 0],
                         offsets if packed else None, window=window, scale=scale,
                         packed=packed, return_residual=return_lse)
    if not return_lse:
      return result, None
    out, stats = result
    lse = (token_lse_from_packed_stats(stats, offsets, lengths) if packed
           else jnp.swapaxes(stats, 1, 2))                       # plain: [b, h, n]
  else:
    mask = packed_mask(offsets, lengths, q.shape[1], window)
    out, lse = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale,
                                            implementation='xla', return_residual=True)
  return out, lse.astype(jnp.float32)


def _finish(out, lse, covered):
  """Padding rows -> 0 (and lse -inf); `out` alone when `lse` is None."""
  out = jnp.where(covered[..., None, None], out.astype(jnp.float32), 0.0)
  return out if lse is None else (out, jnp.where(covered[..., None], lse, -jnp.inf))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _attend_with_lse(q, k, v, offsets, lengths, window, scale, packed, implementation):
  out, lse = _attend(q, k, v, offsets, lengths, window=window, scale=scale, packed=packed,
                     implementation=implementation)
  return out, lse


def _attend_with_lse_fwd(q, k, v, offsets, lengths, window, scale, packed, implementation):
  head_dim = v.shape[-1]
  both, lse = _attend(q, k, jnp.concatenate([v, k.astype(v.dtype)], axis=-1), offsets, lengths,
                      window=window, scale=scale, packed=packed, implementation=implementation)
  out, expected_key = both[..., :head_dim], both[..., head_dim:]
  # Rows outside every run are unwritten by cuDNN (garbage, NaN at times: seen on an H200 in
  # the two-sided window's reversed pass, whose padding comes first). The backward multiplies
  # them by a zero cotangent, and 0 * NaN is NaN: zero them here.
  covered = covered_slots(offsets, lengths, q.shape[1])
  expected_key = jnp.where(covered[..., None, None], expected_key, jnp.zeros_like(expected_key))
  return (out, lse), (q, k, v, offsets, lengths, expected_key)


def _attend_with_lse_bwd(window, scale, packed, implementation, residuals, cotangents):
  q, k, v, offsets, lengths, expected_key = residuals
  d_out, d_lse = cotangents
  d_lse = jnp.where(jnp.isfinite(d_lse), d_lse, 0.0).astype(jnp.float32)
  lse_cotangent = (scale * d_lse[..., None] * q.astype(jnp.float32)).astype(d_out.dtype)
  values = jnp.concatenate([v, jnp.zeros_like(v)], axis=-1)
  run = lambda q_, k_, values_: _attend(q_, k_, values_, offsets, lengths, window=window,
                                        scale=scale, packed=packed, return_lse=False,
                                        implementation=implementation)[0]
  _, pullback = jax.vjp(run, q, k, values)
  d_q, d_k, d_values = pullback(jnp.concatenate([d_out, lse_cotangent], axis=-1))
  head_dim = v.shape[-1]
  d_q = d_q + (scale * d_lse[..., None] * expected_key.astype(jnp.float32)).astype(d_q.dtype)
  d_k = d_k + d_values[..., head_dim:].astype(d_k.dtype)
  return (d_q.astype(q.dtype), d_k.astype(k.dtype), d_values[..., :head_dim].astype(v.dtype),
          None, None)


_attend_with_lse.defvjp(_attend_with_lse_fwd, _attend_with_lse_bwd)


def window_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                     segment_ids: jax.Array, valid: jax.Array, *, window: int, scale: float,
                     fallback: Fallback, with_lse: bool = False,
                     implementation: str = 'cudnn', max_segments: int = MAX_SEGMENTS):
  """Causal sliding-window attention over one sequence of slots (module docstring).

  Args:
    q: `[batch, n, heads, head_dim]`, unscaled; query i sits at key slot i
      (slots that are not queries, e.g. a cache before the chunk, may hold
      anything; the caller drops their rows).
    k, v: `[batch, n, heads, head_dim]`.
    positions, segment_ids, valid: `[batch, n]` of the slots.
    window: keys at positions `p - window .. p`.
    scale: logits are `scale * q . k`.
    fallback: `(q, k, v) -> (out, lse)`, the exact XLA kernel for batches
      that do not `fit`.
    with_lse: also return the log-sum-exp, with its gradient.
  Returns:
    `out [batch, n, heads, head_dim]` float32 (0 on padding rows), and with
    `with_lse` `lse [batch, n, heads]` float32 (-inf there).
  """
  def slow(q, k, v):
    out, lse = fallback(q, k, v)
    return _finish(out, lse.astype(jnp.float32) if with_lse else None, valid)

  def fast(q, k, v):
    return fitted_window_attention(q, k, v, segment_ids, valid, window=window, scale=scale,
                                   with_lse=with_lse, implementation=implementation,
                                   max_segments=max_segments)

  return jax.lax.cond(fits(positions, segment_ids, valid, max_segments), fast, slow, q, k, v)


def fitted_window_attention(q, k, v, segment_ids, valid, *, window: int, scale: float,
                            with_lse: bool = False, implementation: str = 'cudnn',
                            max_segments: int = MAX_SEGMENTS):
  """`window_attention` for inputs that `fit`: cuDNN's plain padding lengths when every row
  is one document from slot 0, else packed segments (no fallback)."""
  offsets, lengths, _ = packed_segments(segment_ids, valid, max_segments)

  def kernel(packed):
    def run(q, k, v):
      if with_lse:
        out, lse = _attend_with_lse(q, k, v, offsets, lengths, window, scale, packed,
                                    implementation)
        return _finish(out, lse, valid)   # every valid slot lies in a packed run
      out, _ = _attend(q, k, v, offsets, lengths, window=window, scale=scale, packed=packed,
                       implementation=implementation, return_lse=False)
      return _finish(out, None, valid)
    return run

  return jax.lax.cond(single_prefix_run(segment_ids, valid), kernel(False), kernel(True),
                      q, k, v)

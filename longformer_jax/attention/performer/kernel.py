"""The Performer kernel, FAVOR+ (Choromanski et al., 2021, "Rethinking Attention with Performers").

Softmax attention exp(q . k / sqrt(d)) is replaced by a random-feature kernel
phi(q) . phi(k) (`attention/performer/random_features.py`: positive orthogonal features for
the softmax kernel, or the ReLU kernel of generalised attention), and the
attention is computed in O(n) by associativity (sec. 2.2, eq. for Att):

  out_i = phi(q_i) . sum_j phi(k_j) v_j^T / phi(q_i) . sum_j phi(k_j),

the sums over the keys j that query i may attend to under the causal,
document and padding rule of `masking.py`. A query with no such key gives 0.

Numerical shifts (softmax kernel). Every product phi(q_i)_m phi(k_j)_m =
exp(a_im + b_jm) (log-features a, b; 1/sqrt(m) and exp(-|q|^2 / 2) cancel in
the ratio and are left out) is computed as exp(a_im - c_i + g) exp(b_jm - g),
stop-gradient shifts that cancel exactly. r_im is the largest m-th log-feature
of the keys query i sees and c_i = max_m (a_im + r_im), so the largest term of
the query's normaliser is exactly 1. Each key shift g is at most the r of
every query it serves and at least every key it shifts, so both factors are <=
1 and only terms far below the largest can underflow (shared shifts made the
normaliser underflow: one for all features, late in training; one per block or
per chunk, once the keys a query sees lay ~88 nats below keys it cannot see).
g is: bidirectional, per (document, head, feature) the max over the document's
keys in the chunk; causal, for the carry the running max per (row, head,
feature) over its document's keys (restarting with each document), and inside
a block, per rectangle of later queries x earlier keys (`_causal_in_block`),
the r of its last key slot. Exact for any spread of log-features
(tests/attention/test_adversarial_performer_routing.py) that float32 holds to well under
88 nats: log-features of ~1e9 (q, k of norm ~1e5) are rounded by hundreds of
nats, a factor overflows and the output is NaN (a known defect, asserted in
tests/attention/test_adversarial_documents.py at bfloat16 token norms ~6e5).

Causal (`model.causal`): prefix sums. A `lax.scan` runs over blocks of
`block_len` positions; inside a block the exact part (`[block, block]` at
most), across blocks a carried S = sum phi(k) v^T
`[heads, m, head_dim]` and z = sum phi(k) `[heads, m]` that hold only keys of
one document: at a block's end the carry becomes its old value plus the
block's keys if the block's last token is of the carry's document, else only
the block's keys of that last document. A query sees the carry iff it is of
the carry's document. Never an n x n array, never a loop over positions.

Bidirectional: where each row's valid keys are one document (an encoder's rows), every
query reads the whole row's S and z, two matmuls; rows of several documents run the
causal scan forward and again over the reversed chunk (keys strictly after the query).
"""

import functools

import flax.struct
import jax
import jax.numpy as jnp

from longformer_jax.attention.performer import random_features
from longformer_jax.attention.core.masking import causal_document_mask

KERNELS = ('softmax', 'relu')
RELU_EPS = 1e-3


@flax.struct.dataclass
class PerformerState:
  """The causal carry: sums over the keys of one document, scaled by exp(-shift).

  The true sums are `sums * exp(shift)[..., None]` and `normaliser * exp(shift)`
  (softmax kernel; the ReLU kernel keeps shift 0).
  """
  sums: jax.Array         # [batch, heads, m, head_dim] float32: S = sum phi(k) v^T
  normaliser: jax.Array   # [batch, heads, m] float32: z = sum phi(k)
  shift: jax.Array        # [batch, heads, m] float32: the keys' shift per feature
  segment_ids: jax.Array  # [batch] int32: the document of the summed keys
  valid: jax.Array        # [batch] bool: the sums hold keys
  period: jax.Array       # [batch] int32: the feature draw the sums were made with

  def logical_axes(self) -> 'PerformerState':
    return PerformerState(sums=('batch', 'heads', None, 'head_dim'),
                          normaliser=('batch', 'heads', None), shift=('batch', 'heads', None),
                          segment_ids=('batch',), valid=('batch',), period=('batch',))


def empty_state(batch: int, heads: int, num_features: int, head_dim: int) -> PerformerState:
  return PerformerState(
      sums=jnp.zeros((batch, heads, num_features, head_dim), jnp.float32),
      normaliser=jnp.zeros((batch, heads, num_features), jnp.float32),
      shift=jnp.zeros((batch, heads, num_features), jnp.float32),
      segment_ids=jnp.zeros((batch,), jnp.int32), valid=jnp.zeros((batch,), bool),
      period=jnp.zeros((batch,), jnp.int32))


def _causal_in_block(relative, logits, seen, v, segments, valid):
  """Causal softmax-kernel attention inside a block, exact at any spread, by halving.

  Args:
    relative: a_i - c_i `[b, L, h, m]`; logits: the keys' log-features b_j,
      -inf at padding; seen: r `[b, L, h, m]` (module docstring).
    v: `[b, L, h, d]`; segments, valid: `[b, L]`.
  Returns:
    (numerator `[b, L, h, d]`, denominator `[b, L, h]`) over the block's keys at
    or before each query, of its document.

  A query meets its own key on the diagonal (exp(a_i - c_i + b_i) <= 1) and
  each earlier key in exactly one rectangle: the second half of a span of
  2, 4, ... slots against its first half, shifted by the r of the first
  half's last slot (module docstring). The same FLOPs as half the masked
  L x L product; L is padded to a power of two.
  """
  length = relative.shape[1]
  size = 1 << (length - 1).bit_length()
  widths = lambda a: [(0, 0), (0, size - length)] + [(0, 0)] * (a.ndim - 2)  # noqa: E731
  relative, logits, v, valid = (jnp.pad(a, widths(a), constant_values=fill) for a, fill in
                                ((relative, 0.0), (logits, -jnp.inf), (v, 0.0), (valid, False)))
  seen, segments = (jnp.pad(a, widths(a), mode='edge') for a in (seen, segments))
  weight = jnp.sum(jnp.exp(relative + logits), axis=-1)                   # [b, size, h]
  num, den = weight[..., None] * v, weight
  half = 1
  while half < size:
    split = lambda a: a.reshape(a.shape[0], size // (2 * half), 2, half,  # noqa: E731
                                *a.shape[2:])                            # [b, spans, 2, half, ..]
    later = lambda a: jnp.stack([jnp.zeros_like(a), a], axis=2).reshape(  # noqa: E731
        a.shape[0], size, *a.shape[3:])                                  # second halves
    end_seg = split(segments)[:, :, 0, -1, None]                           # [b, spans, 1]
    shift = split(seen)[:, :, 0, -1, None]                                 # [b, spans, 1, h, m]
    keys_in = split(valid)[:, :, 0] & (split(segments)[:, :, 0] == end_seg)
    queries_in = split(segments)[:, :, 1] == end_seg                       # [b, spans, half]
    usable = lambda seen_by: seen_by[..., None, None] & jnp.isfinite(shift)  # noqa: E731
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    phi_k = jnp.exp(jnp.where(usable(keys_in), split(logits)[:, :, 0] - shift, -jnp.inf))
    phi_q = jnp.exp(jnp.where(usable(queries_in), split(relative)[:, :, 1] + shift, -jnp.inf))
    w = jnp.einsum('bpqhm,bpkhm->bphqk', phi_q, phi_k)
    num = num + later(jnp.einsum('bphqk,bpkhd->bpqhd', w, split(v)[:, :, 0]))
    den = den + later(jnp.swapaxes(jnp.sum(w, axis=-1), 2, 3))
    half *= 2
  return num[:, :length], den[:, :length]


def _block_step(carry: PerformerState, block, *, shifted: bool, inclusive: bool):
  """One block: the carry's part, the exact in-block part, then the carry update.

  `block`: queries and keys `[b, L, h, m]` (log-features if `shifted`, else
  features); v `[b, L, h, d]`; positions, segments, valid `[b, L]`.
  Returns the new carry and the unnormalised (numerator `[b, L, h, d]`,
  denominator `[b, L, h]`).
  """
  queries, keys, v, positions, segments, valid = block
  # Earlier blocks (and chunks): only queries of the carry's document see them.
  sees_carry = carry.valid[:, None] & (segments == carry.segment_ids[:, None])     # [b, L]
  # The carry keeps the keys of the block's last document (with the old sums if it is theirs).
  last = segments[:, -1]
  keep = carry.valid & (carry.segment_ids == last)                                # [b]
  joins = valid & (segments == last[:, None])                                     # [b, L]
  if shifted:   # the shifts of the module docstring; the carry's keys are all <= its shift
    assert inclusive, 'the softmax-kernel scan is causal: keys at or before the query'
    logits = jnp.where(valid[:, :, None, None], keys, -jnp.inf)
    carried = jnp.where(sees_carry[:, :, None, None], carry.shift[:, None], -jnp.inf)
    seen = jax.lax.stop_gradient(   # r: the max log-feature of the keys each query sees
        jnp.maximum(carried, random_features.segmented_cummax(logits, segments)))
    top = jnp.max(queries + seen, axis=-1, keepdims=True)                  # c [b, L, h, 1]
    relative = queries - jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
    phi_q_carry = jnp.exp(jnp.where(sees_carry[:, :, None, None],
                                    relative + carry.shift[:, None], -jnp.inf))
    num, den = _causal_in_block(relative, logits, seen, v, segments, valid)
    shift = jnp.where(jnp.isfinite(seen[:, -1]), seen[:, -1], 0.0)         # the last document's r
    phi_k_carry = jnp.exp(jnp.where(joins[:, :, None, None], logits - shift[:, None], -jnp.inf))
    scale = jnp.where(keep[:, None, None], jnp.exp(jnp.minimum(carry.shift - shift, 0.0)), 0.0)
  else:
    phi_q_carry = queries
    phi_k_carry = phi_k = jnp.where(valid[:, :, None, None], keys, 0.0)
    shift = carry.shift
    scale = jnp.broadcast_to(keep[:, None, None], shift.shape).astype(jnp.float32)
    # The block itself, exactly: keys at (or, not `inclusive`, strictly before) the query.
    allowed = causal_document_mask(positions if inclusive else positions - 1, segments,
                                   positions, segments, valid)            # [b, L, L]
    weights = jnp.einsum('bqhm,bkhm->bhqk', queries, phi_k) * allowed[:, None].astype(
        jnp.float32)
    num = jnp.einsum('bhqk,bkhd->bqhd', weights, v)
    den = jnp.swapaxes(jnp.sum(weights, axis=-1), 1, 2)

  on_carry = sees_carry.astype(jnp.float32)
  num = num + jnp.einsum('blhm,bhmd->blhd', phi_q_carry, carry.sums) * on_carry[..., None, None]
  den = den + jnp.einsum('blhm,bhm->blh', phi_q_carry, carry.normaliser) * on_carry[..., None]
  kept = phi_k_carry * joins[:, :, None, None].astype(jnp.float32)
  new = PerformerState(
      sums=carry.sums * scale[..., None] + jnp.einsum('bkhm,bkhd->bhmd', kept, v),
      normaliser=carry.normaliser * scale + jnp.sum(kept, axis=1),
      shift=shift, segment_ids=last, valid=keep | jnp.any(joins, axis=1),
      period=carry.period)
  return new, (num, den)


def shifted_query_features(logits: jax.Array, key_shift: jax.Array) -> jax.Array:
  """exp(logits + key_shift - c) with c the max over the m features: `[b, L, h, m]`."""
  logits = logits + key_shift
  return jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)))


def linear_attention_blocks(queries: jax.Array, keys: jax.Array, v: jax.Array,
                            positions: jax.Array, segment_ids: jax.Array, valid: jax.Array,
                            carry: PerformerState, *, block_len: int, shifted: bool,
                            inclusive: bool = True):
  """Causal linear attention by a scan over blocks (module docstring).

  Args:
    queries, keys: `[batch, n, heads, m]` log-features (`shifted`) or features.
    v: `[batch, n, heads, head_dim]`.
    positions, segment_ids: `[batch, n]` int32 (segments non-decreasing along
      the row); valid: `[batch, n]` bool.
    carry: the sums of earlier keys (`PerformerState`).
    block_len: L; n need not be a multiple of it.
    inclusive: a query sees its own key (False: only keys strictly before it).
  Returns:
    `(numerator [b, n, h, d], denominator [b, n, h], carry)`, float32.
  """
  batch, n = queries.shape[:2]
  block = min(block_len, n)
  padded = -(-n // block) * block

  def pad(a, mode='constant'):
    return jnp.pad(a, [(0, 0), (0, padded - n)] + [(0, 0)] * (a.ndim - 2), mode=mode)

  def to_blocks(a):  # [b, padded, ...] -> [blocks, b, L, ...]
    return jnp.moveaxis(a.reshape(batch, padded // block, block, *a.shape[2:]), 1, 0)

  def from_blocks(a):
    return jnp.moveaxis(a, 0, 1).reshape(batch, padded, *a.shape[3:])[:, :n]

  inputs = (pad(queries), pad(keys), pad(v.astype(jnp.float32)), pad(positions, 'edge'),
            pad(segment_ids, 'edge'), pad(valid))
  step = functools.partial(_block_step, shifted=shifted, inclusive=inclusive)
  carry, (num, den) = jax.lax.scan(step, carry, tuple(map(to_blocks, inputs)))
  return from_blocks(num), from_blocks(den), carry


def normalised(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den `[b, n, h, d]`; rows with den = 0 (no key) give 0, with finite gradients."""
  nonzero = den > 0
  return jnp.where(nonzero[..., None], num / jnp.where(nonzero, den, 1.0)[..., None], 0.0)


def causal_performer_attention(q, k, v, positions, segment_ids, valid, features,
                               carry: PerformerState, *, kernel: str = 'softmax',
                               block_len: int = 64, relu_eps: float = RELU_EPS):
  """Causal FAVOR+ over `[batch, n, heads, head_dim]` q, k, v after `carry`.

  `features`: W `[m, head_dim]`. Returns `(out [b, n, h, d] float32, carry)`.
  """
  if kernel == 'relu':
    queries, keys = (random_features.relu_features(x, features, relu_eps) for x in (q, k))
  else:
    queries, keys = (random_features.softmax_logits(x, features) for x in (q, k))
  num, den, carry = linear_attention_blocks(queries, keys, v, positions, segment_ids, valid,
                                            carry, block_len=block_len,
                                            shifted=kernel != 'relu')
  return normalised(num, den), carry


def _valid_segment_range(segment_ids: jax.Array, valid: jax.Array):
  """(lowest, highest) segment id of each row's valid keys `[b]` (the dtype's max and min
  for a row without any)."""
  limits = jnp.iinfo(segment_ids.dtype)
  return (jnp.min(jnp.where(valid, segment_ids, limits.max), axis=1),
          jnp.max(jnp.where(valid, segment_ids, limits.min), axis=1))


def one_document_per_row(segment_ids: jax.Array, valid: jax.Array) -> jax.Array:
  """True when each row's valid keys `[b, n]` all belong to one document (an encoder's rows
  always do); a row without valid keys counts as one."""
  first, last = _valid_segment_range(segment_ids, valid)
  return jnp.all((first == last) | ~jnp.any(valid, axis=1))


def _bidirectional_features(q, k, valid, key_shift, features, kernel, relu_eps):
  """(phi(q), phi(k)) `[b, n, h, m]` with phi(k) = 0 at padding; the softmax kernel's key
  shift is `key_shift(logits)` of the keys' log-features, -inf at padding."""
  if kernel == 'relu':
    phi_q, phi_k = (random_features.relu_features(x, features, relu_eps) for x in (q, k))
    return phi_q, jnp.where(valid[:, :, None, None], phi_k, 0.0)
  logits = jnp.where(valid[:, :, None, None], random_features.softmax_logits(k, features),
                     -jnp.inf)
  shift = key_shift(logits)
  shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
  return shifted_query_features(random_features.softmax_logits(q, features), shift), jnp.exp(
      logits - shift)


def whole_row_attention(q, k, v, positions, segment_ids, valid, features, *, kernel,
                         block_len, relu_eps):
  """Bidirectional attention when each row's valid keys are one document: every query of
  that document reads the same sums S = sum_j phi(k_j) v_j^T `[b, h, m, d]` and
  z = sum_j phi(k_j) (FAVOR+ eq. for Att, non-causal), two matmuls and no scan. The
  softmax kernel's key shift is the max over the row's keys (`two_scan_attention`'s
  per-document shift, for one document)."""
  del positions, block_len
  phi_q, phi_k = _bidirectional_features(
      q, k, valid, lambda logits: jnp.max(logits, axis=1, keepdims=True), features, kernel,
      relu_eps)
  sums = jnp.einsum('bkhm,bkhd->bhmd', phi_k, v.astype(jnp.float32))
  document, _ = _valid_segment_range(segment_ids, valid)
  reads = (segment_ids == document[:, None]).astype(jnp.float32)[..., None]     # [b, n, 1]
  num = jnp.einsum('bqhm,bhmd->bqhd', phi_q, sums) * reads[..., None]
  den = jnp.einsum('bqhm,bhm->bqh', phi_q, jnp.sum(phi_k, axis=1)) * reads
  return normalised(num, den)


def two_scan_attention(q, k, v, positions, segment_ids, valid, features, *, kernel,
                       block_len, relu_eps):
  """Bidirectional attention for rows of several documents: the causal scan forward, then
  over the reversed chunk for the keys after each query."""
  # The softmax kernel's shift: one per (document, head, feature) over the chunk.
  phi_q, phi_k = _bidirectional_features(
      q, k, valid, lambda logits: random_features.segment_max(logits, segment_ids), features,
      kernel, relu_eps)
  empty = empty_state(q.shape[0], q.shape[2], features.shape[0], v.shape[-1])
  run = functools.partial(linear_attention_blocks, block_len=block_len, shifted=False)
  num, den, _ = run(phi_q, phi_k, v, positions, segment_ids, valid, empty)
  # Keys after the query: the same scan over the reversed chunk, strictly before.
  flip = lambda a: jnp.flip(a, axis=1)  # noqa: E731
  num_after, den_after, _ = run(flip(phi_q), flip(phi_k), flip(v), -flip(positions),
                                flip(segment_ids), flip(valid), empty, inclusive=False)
  return normalised(num + flip(num_after), den + flip(den_after))


def bidirectional_performer_attention(q, k, v, positions, segment_ids, valid, features, *,
                                      kernel: str = 'softmax', block_len: int = 64,
                                      relu_eps: float = RELU_EPS) -> jax.Array:
  """Bidirectional FAVOR+ within each document of the chunk: `[b, n, h, d]` float32.

  Rows of one document each (every encoder's) take `whole_row_attention`, others the
  two scans of `two_scan_attention`; both compute the same sums (the tests hold each to
  the dense reference).
  """
  settings = {'kernel': kernel, 'block_len': block_len, 'relu_eps': relu_eps}
  return jax.lax.cond(one_document_per_row(segment_ids, valid),
                      functools.partial(whole_row_attention, **settings),
                      functools.partial(two_scan_attention, **settings),
                      q, k, v, positions, segment_ids, valid, features)

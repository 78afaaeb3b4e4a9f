"""Block-sparse flash attention in Pallas for GPUs (Triton), with a static mask of blocks.

`block_sparse_attention(q, k, v, segment_ids, valid, mask=rule)` computes what
`splash_kernels.splash_attention` computes (the same rules on slots: the Sparse
Transformer's `Strided` / `Fixed`, BigBird's `BigBirdBlocks`, `BlockLocal`,
`Window`, `Union`, one rule or one per head; documents and padding as segment
ids; a query with no allowed key gives 0), with a kernel that a GPU compiles:

- the rule is evaluated once, in numpy, when the kernel is traced, into a
  table per query block (`block_q` slots) of the key blocks (`block_k` slots,
  block_q = m * block_k) it touches (`block_sparse_tables.py`): empty tiles are
  never visited, so the work is the fraction of tiles the pattern keeps; a
  tile the rule keeps only in part gets its element mask `[block_q, block_k]`
  from a small table of distinct partial masks, and whole tiles, visited
  first, load no mask at all. A query block of m sub-blocks visits the union
  of their key blocks: m times fewer programs, each key block loaded once per
  query block instead of once per sub-block;
- forward: one program per (row, head, query block) runs an online softmax
  (flash attention, float32 accumulation) over its key blocks and writes the
  output and its log-sum-exp;
- backward (flash attention 2): `dq` per query block over the same key blocks,
  `dk, dv` per key block over the transposed table, both recomputing the
  weights from the saved log-sum-exp; `delta = rowsum(d_out * out)` outside;
- a row with more than `max_visits` blocks (BigBird's global key blocks, seen
  by every query block) is split over several programs, merged afterwards by
  log-sum-exp (forward) or summed (gradients), so that no single program
  walks the whole sequence while the rest of the GPU waits.

Heads with different rules (the Sparse Transformer's multihead integration)
run as one call per distinct rule. The kernel runs compiled by Triton on a GPU
and in Pallas interpret mode elsewhere (the CPU tests). Queries are scaled by
the caller, as for splash.
"""

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

from longformer_jax.attention.core.block_sparse_tables import (ProgramTable, block_tables,
                                                             device_arrays, program_table)
from longformer_jax.attention.core.splash_kernels import Window, head_rules, splash_attention

NO_KEY = -1e30


@dataclasses.dataclass(frozen=True)
class KernelTuning:
  """The kernel's static shape on a GPU (measured in docs/benchmarks.md, "Tuning the Pallas
  kernel"). block_q, block_k: the query and key blocks of a tile (powers of two >= 16 for
  Triton, block_q a multiple of block_k); num_warps, num_stages: Triton's; max_visits,
  split_over_mean: a row of more than `max_visits` blocks is split over several programs
  when the longest row has more than `split_over_mean` x the mean visits
  (`block_sparse_tables.program_table`)."""
  block_q: int = 64
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 2
  max_visits: Optional[int] = 32
  split_over_mean: float = 4.0

  def __post_init__(self):
    for field in ('block_q', 'block_k'):
      size = getattr(self, field)
      if not (isinstance(size, int) and size >= 16 and size & (size - 1) == 0):
        raise ValueError(f'KernelTuning.{field}: {size!r} must be a power of two >= 16')
    if self.block_q % self.block_k:
      raise ValueError(f'KernelTuning.block_q: {self.block_q} must be a multiple of block_k '
                       f'({self.block_k})')

  def compiler_params(self):
    # Triton, not Mosaic GPU (JAX's default GPU lowering for pallas_call): Mosaic GPU stages
    # every block in shared memory, and the whole-row key / value blocks do not fit there.
    return pallas_triton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def _dot(a, b):
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_t(a, b):     # a @ b.T
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _over_visits(table_refs, p, block, step, carry):
  """`carry = step(other, element_mask, carry)` over program p's visits, `other` the slice of
  the visited block (of `block` slots): whole tiles first with no mask loaded
  (`element_mask` None), then the partial ones with their `[block_q, block_k]` mask."""
  _, index_ref, mask_ref, count_ref, full_ref, masks_ref = table_refs

  def body(masked):
    def run(t, c):
      element_mask = (masks_ref[mask_ref[p, t]] != 0) if masked else None
      return step(pl.ds(index_ref[p, t] * block, block), element_mask, c)
    return run

  carry = jax.lax.fori_loop(0, full_ref[p], body(False), carry)
  return jax.lax.fori_loop(full_ref[p], count_ref[p], body(True), carry)


def _allowed(element_mask, q_seg, kv_seg):
  same = q_seg[:, None] == kv_seg[None, :]
  return same if element_mask is None else same & element_mask


# Every array in the layers' layout, [batch, slots, heads, head_dim] ([batch, slots, heads]
# for the log-sum-exp and delta), so that nothing is transposed around the kernels: a
# program of head h reads `x_ref[0, slots, 0, :]` of its (batch, head) slice.

def _forward_kernel(*refs, block_q, block_k):
  table_refs = refs[:6]
  q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, out_ref, lse_ref = refs[6:]
  p = pl.program_id(2)
  queries = pl.ds(table_refs[0][p] * block_q, block_q)
  q, q_seg = q_ref[0, queries, 0, :], q_seg_ref[0, queries]

  def step(keys, element_mask, carry):
    m, l, acc = carry
    k, v = k_ref[0, keys, 0, :], v_ref[0, keys, 0, :]
    allowed = _allowed(element_mask, q_seg, kv_seg_ref[0, keys])
    s = _dot_t(q, k)
    m_new = jnp.maximum(m, jnp.max(jnp.where(allowed, s, NO_KEY), axis=1))
    p_ = jnp.where(allowed, jnp.exp(s - m_new[:, None]), 0.0)
    correction = jnp.exp(m - m_new)
    return (m_new, l * correction + jnp.sum(p_, axis=1),
            acc * correction[:, None] + _dot(p_.astype(v.dtype), v))

  init = (jnp.full((block_q,), NO_KEY, jnp.float32), jnp.zeros((block_q,), jnp.float32),
          jnp.zeros((block_q, v_ref.shape[-1]), jnp.float32))
  m, l, acc = _over_visits(table_refs, p, block_k, step, init)
  has_key = l > 0
  out_ref[0, :, 0, :] = (acc / jnp.where(has_key, l, 1.0)[:, None]).astype(out_ref.dtype)
  lse_ref[0, :, 0] = jnp.where(has_key, m + jnp.log(jnp.where(has_key, l, 1.0)), -jnp.inf)


def _dq_kernel(*refs, block_q, block_k):
  table_refs = refs[:6]
  q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dq_ref = refs[6:]
  p = pl.program_id(2)
  queries = pl.ds(table_refs[0][p] * block_q, block_q)
  q, do, q_seg = q_ref[0, queries, 0, :], do_ref[0, queries, 0, :], q_seg_ref[0, queries]
  lse, delta = lse_ref[0, queries, 0], delta_ref[0, queries, 0]

  def step(keys, element_mask, dq):
    k, v = k_ref[0, keys, 0, :], v_ref[0, keys, 0, :]
    allowed = _allowed(element_mask, q_seg, kv_seg_ref[0, keys])
    p_ = jnp.where(allowed, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)
    ds = p_ * (_dot_t(do, v) - delta[:, None])
    return dq + _dot(ds.astype(k.dtype), k)

  dq = _over_visits(table_refs, p, block_k, step, jnp.zeros(q.shape, jnp.float32))
  dq_ref[0, :, 0, :] = dq.astype(dq_ref.dtype)


def _dkdv_kernel(*refs, block_q, block_k):
  table_refs = refs[:6]
  q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref = refs[6:]
  p = pl.program_id(2)
  keys = pl.ds(table_refs[0][p] * block_k, block_k)
  k, v, kv_seg = k_ref[0, keys, 0, :], v_ref[0, keys, 0, :], kv_seg_ref[0, keys]

  def step(queries, element_mask, carry):
    dk, dv = carry
    q, do = q_ref[0, queries, 0, :], do_ref[0, queries, 0, :]
    lse, delta = lse_ref[0, queries, 0], delta_ref[0, queries, 0]
    allowed = _allowed(element_mask, q_seg_ref[0, queries], kv_seg)
    p_ = jnp.where(allowed, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)      # [block_q, block_k]
    ds = p_ * (_dot_t(do, v) - delta[:, None])
    return (dk + _dot(ds.T.astype(q.dtype), q), dv + _dot(p_.T.astype(do.dtype), do))

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = _over_visits(table_refs, p, block_q, step, (zeros, zeros))
  dk_ref[0, :, 0, :] = dk.astype(dk_ref.dtype)
  dv_ref[0, :, 0, :] = dv.astype(dv_ref.dtype)


def _programs(rule, tuning, n):
  """The forward / dq side's and the dk, dv side's program tables, and the masks."""
  t = block_tables(rule, n, tuning.block_q, tuning.block_k)
  split = (tuning.max_visits, tuning.split_over_mean)
  return (program_table(t.kv_index, t.kv_mask, t.kv_count, t.kv_full, *split),
          program_table(t.q_index, t.q_mask, t.q_count, t.q_full, *split), t.masks)


def _call(kernel, table: ProgramTable, masks, tuning, interpret, inputs, outputs, block):
  """One pallas_call, grid (batch, heads, programs): every input whole for its (batch, head);
  each output `[b, programs * block, h(, d)]` written block by block, `block` the size of
  the programs' rows (block_q for the forward and dq, block_k for dk, dv; `outputs`:
  (with a head_dim, dtype))."""
  b, _, h, d = inputs[0].shape
  num = table.num_programs
  arrays = device_arrays(table, masks)

  def whole(shape):
    return pl.BlockSpec(shape, lambda b_, h_, p: (0,) * len(shape))

  def slice_of(shape):        # [b, n, h, d], [b, n, h] or [b, n] (segments)
    if len(shape) == 2:
      return pl.BlockSpec((1, shape[1]), lambda b_, h_, p: (b_, 0))
    return pl.BlockSpec((1, shape[1], 1) + shape[3:],
                        lambda b_, h_, p: (b_, 0, h_) + (0,) * (len(shape) - 3))

  out_specs, out_shape = [], []
  for with_dim, dtype in outputs:
    trailing = (d,) if with_dim else ()
    out_specs.append(pl.BlockSpec((1, block, 1) + trailing,
                                  lambda b_, h_, p, t=trailing: (b_, p, h_) + (0,) * len(t)))
    out_shape.append(jax.ShapeDtypeStruct((b, num * block, h) + trailing, dtype))
  return pl.pallas_call(
      functools.partial(kernel, block_q=tuning.block_q, block_k=tuning.block_k),
      grid=(b, h, num),
      in_specs=[whole(a.shape) for a in arrays] + [slice_of(x.shape) for x in inputs],
      out_specs=out_specs, out_shape=out_shape, interpret=interpret,
      compiler_params=tuning.compiler_params())(*arrays, *inputs)


def _firsts_and_others(parts, table: ProgramTable, block, n):
  """`[b, programs * block, ...]` -> the rows' first programs `[b, rows, block, ...]`, the
  split rows' other programs `[b, others, block, ...]` and those programs' rows."""
  b, rest = parts.shape[0], parts.shape[2:]
  firsts = parts[:, :n].reshape((b, n // block, block) + rest)
  others = parts[:, n:].reshape((b, -1, block) + rest)
  return firsts, others, jnp.asarray(table.row[n // block:])


def _merge_softmax(out, lse, table, block, n, dtype):
  """Programs that split one row merged by their log-sum-exps:
  out = sum_p exp(lse_p - lse) out_p, lse = log sum_p exp(lse_p). Only the split rows'
  other programs are scattered; the first programs lie in place."""
  if not table.split:
    return out, lse
  out_first, out_other, rows = _firsts_and_others(out, table, block, n)
  lse_first, lse_other, _ = _firsts_and_others(lse, table, block, n)
  top = lse_first.at[:, rows].max(lse_other)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  weight_first = jnp.exp(lse_first - top)                  # 0 for a part with no key
  weight_other = jnp.exp(lse_other - top[:, rows])
  total = weight_first.at[:, rows].add(weight_other)
  merged = (weight_first[..., None] * out_first).at[:, rows].add(
      weight_other[..., None] * out_other)
  safe = jnp.where(total > 0, total, 1.0)
  b = out.shape[0]
  return ((merged / safe[..., None]).reshape((b, n) + out.shape[2:]).astype(dtype),
          jnp.where(total > 0, top + jnp.log(safe), -jnp.inf).reshape((b, n) + lse.shape[2:]))


def _sum_parts(parts, table, block, n, dtype):
  """Programs that split one row summed (dq, dk, dv are sums over the visited blocks)."""
  if not table.split:
    return parts
  first, other, rows = _firsts_and_others(parts, table, block, n)
  return first.at[:, rows].add(other).reshape((parts.shape[0], n) + parts.shape[2:]).astype(dtype)


def _part_dtype(table, dtype):
  return jnp.float32 if table.split else dtype


def _forward(rule, tuning, interpret, q, k, v, q_seg, kv_seg):
  n = q.shape[1]
  rows, _, masks = _programs(rule, tuning, n)
  out, lse = _call(_forward_kernel, rows, masks, tuning, interpret, (q, k, v, q_seg, kv_seg),
                   [(True, _part_dtype(rows, q.dtype)), (False, jnp.float32)], tuning.block_q)
  return _merge_softmax(out, lse, rows, tuning.block_q, n, q.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attention(rule, tuning, interpret, q, k, v, q_seg, kv_seg):
  return _forward(rule, tuning, interpret, q, k, v, q_seg, kv_seg)[0]


def _attention_fwd(rule, tuning, interpret, q, k, v, q_seg, kv_seg):
  out, lse = _forward(rule, tuning, interpret, q, k, v, q_seg, kv_seg)
  return out, (q, k, v, q_seg, kv_seg, out, lse)


def _attention_bwd(rule, tuning, interpret, residuals, d_out):
  q, k, v, q_seg, kv_seg, out, lse = residuals
  n = q.shape[1]
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)    # [b, n, h]
  rows, columns, masks = _programs(rule, tuning, n)
  inputs = (q, k, v, q_seg, kv_seg, d_out, lse, delta)
  (dq,) = _call(_dq_kernel, rows, masks, tuning, interpret, inputs,
                [(True, _part_dtype(rows, q.dtype))], tuning.block_q)
  dk, dv = _call(_dkdv_kernel, columns, masks, tuning, interpret, inputs,
                 [(True, _part_dtype(columns, k.dtype)), (True, _part_dtype(columns, v.dtype))],
                 tuning.block_k)
  return (_sum_parts(dq, rows, tuning.block_q, n, q.dtype),
          _sum_parts(dk, columns, tuning.block_k, n, k.dtype),
          _sum_parts(dv, columns, tuning.block_k, n, v.dtype), None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def masked_kernel(backend: str):
  """The kernel of static masks on slots that `backend` names ('splash' or 'pallas_gpu');
  both take `(q, k, v, segment_ids, valid, mask=rule | left=, right=, interpret=)`."""
  return block_sparse_attention if backend == 'pallas_gpu' else splash_attention


def block_sparse_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                           valid: jax.Array, *, left: Optional[int] = None,
                           right: Optional[int] = 0, mask=None,
                           tuning: KernelTuning = KernelTuning(),
                           interpret: Optional[bool] = None) -> jax.Array:
  """Masked softmax attention within one chunk, visiting only the blocks `mask` keeps.

  Args:
    q: `[batch, chunk, heads, head_dim]`, already scaled.
    k, v: `[batch, chunk, heads, head_dim]`.
    segment_ids: `[batch, chunk]` int32 document ids; valid: `[batch, chunk]` bool keys.
    left, right: the window `Window(left, right)` when `mask` is None (as splash).
    mask: a rule on slot ids (splash_kernels' rules) for every head, or one per head.
    tuning: query and key block sizes, Triton's warps and stages, and the row split
      (`KernelTuning`).
    interpret: Pallas interpret mode (None: off on GPU only).
  Returns:
    `[batch, chunk, heads, head_dim]` in q's dtype; rows with no allowed key are 0.
  """
  batch, chunk, heads, _ = q.shape
  interpret = jax.default_backend() != 'gpu' if interpret is None else interpret
  length = -(-chunk // tuning.block_q) * tuning.block_q      # a multiple of block_k too
  pad = length - chunk
  absent = jnp.min(segment_ids, axis=1, keepdims=True) - 1          # no real query has it
  in_chunk = jnp.arange(length) < chunk
  padded = jnp.pad(segment_ids, ((0, 0), (0, pad)))
  q_seg = jnp.where(in_chunk, padded, absent).astype(jnp.int32)
  kv_seg = jnp.where(in_chunk & jnp.pad(valid, ((0, 0), (0, pad))), padded,
                     absent - 1).astype(jnp.int32)    # padded queries see no key either
  pad_slots = lambda a: jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))) if pad else a
  qs, ks, vs = pad_slots(q), pad_slots(k), pad_slots(v)
  groups = {}
  for head, rule in enumerate(head_rules(Window(left, right) if mask is None else mask, heads)):
    groups.setdefault(rule, []).append(head)
  outs, order = [], []
  for rule, members in groups.items():
    pick = (lambda a: a) if len(members) == heads else (lambda a, m=members: a[:, :, m])
    outs.append(_attention(rule, tuning, bool(interpret), pick(qs), pick(ks), pick(vs),
                           q_seg, kv_seg))
    order += members
  out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
  if len(outs) > 1:
    out = out[:, :, [order.index(h) for h in range(heads)]]
  return out[:, :chunk]

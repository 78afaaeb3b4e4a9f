"""Block-sparse flash attention in Pallas for GPUs (Triton), with a static mask of blocks.

`block_sparse_attention(q, k, v, segment_ids, valid, mask=rule)` computes what
`splash_kernels.splash_attention` computes (the same rules on slots: the Sparse
Transformer's `Strided` / `Fixed`, BigBird's `BigBirdBlocks`, `BlockLocal`,
`Window`, `Union`, one rule or one per head; documents and padding as segment
ids; a query with no allowed key gives 0), with a kernel that a GPU compiles:

- the rule is evaluated once, in numpy, when the kernel is traced, into a
  table per query block of the key blocks it touches (`BlockTables`): empty
  blocks are never visited, so the work is the fraction of blocks the pattern
  keeps; a block the rule keeps only in part gets its element mask from a
  small table of distinct partial masks (id 0 is the full block);
- forward: one program per (row, head, query block) runs an online softmax
  (flash attention, float32 accumulation) over its key blocks and writes the
  output and its log-sum-exp;
- backward (flash attention 2): `dq` per query block over the same key blocks,
  `dk, dv` per key block over the transposed table, both recomputing the
  weights from the saved log-sum-exp; `delta = rowsum(d_out * out)` outside.

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
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

from longformer_jax.attention.core.splash_kernels import Window, head_rules, splash_attention

DEFAULT_BLOCK = 64
MAX_PARTIAL_MASKS = 4096
# Triton, not Mosaic GPU (JAX's default GPU lowering for pallas_call): Mosaic GPU stages
# every block in shared memory, and the whole-row key / value blocks do not fit there.
TRITON = pallas_triton.CompilerParams(num_warps=4, num_stages=2)
NO_KEY = -1e30


@dataclasses.dataclass(frozen=True)
class BlockTables:
  """Which key blocks each query block visits (and the transpose), as int32 numpy arrays.

  kv_index, kv_mask `[nq, max_k]`: key block and partial-mask id of visit t of query
  block i (`kv_count[i]` visits); q_index, q_mask `[nk, max_q]`, `q_count [nk]`: the
  same seen from key block j; masks `[num, bq, bk]` int32 (id 0: the full block).
  """
  kv_index: np.ndarray
  kv_mask: np.ndarray
  kv_count: np.ndarray
  q_index: np.ndarray
  q_mask: np.ndarray
  q_count: np.ndarray
  masks: np.ndarray

  @property
  def kept_fraction(self) -> float:
    """The fraction of (query block, key block) pairs visited."""
    return float(self.kv_count.sum()) / (self.kv_index.shape[0] * self.q_index.shape[0])


@functools.lru_cache(maxsize=64)
def block_tables(rule, length: int, block: int) -> BlockTables:
  """`rule.allows` on slot ids of a `length`-slot chunk, classified block by block."""
  nb = length // block
  ids = np.arange(length)
  distinct = {np.ones((block, block), bool).tobytes(): 0}
  masks = [np.ones((block, block), bool)]
  visits_q = [[] for _ in range(nb)]
  visits_k = [[] for _ in range(nb)]
  for i in range(nb):
    q_ids = ids[i * block:(i + 1) * block, None]
    allowed_row = np.asarray(rule.allows(q_ids, ids[None, :]), bool)       # [block, length]
    for j in range(nb):
      piece = allowed_row[:, j * block:(j + 1) * block]
      if not piece.any():
        continue
      key = piece.tobytes()
      if key not in distinct:
        distinct[key] = len(masks)
        masks.append(piece.copy())
        if len(masks) > MAX_PARTIAL_MASKS:
          raise ValueError(f'{rule} has more than {MAX_PARTIAL_MASKS} distinct partial blocks '
                           f'of {block} slots')
      visits_q[i].append((j, distinct[key]))
      visits_k[j].append((i, distinct[key]))

  def table(visits):
    width = max(1, max(len(v) for v in visits))
    index = np.zeros((nb, width), np.int32)
    mask = np.zeros((nb, width), np.int32)
    for row, v in enumerate(visits):
      for t, (other, mask_id) in enumerate(v):
        index[row, t], mask[row, t] = other, mask_id
    return index, mask, np.array([len(v) for v in visits], np.int32)

  kv_index, kv_mask, kv_count = table(visits_q)
  q_index, q_mask, q_count = table(visits_k)
  return BlockTables(kv_index, kv_mask, kv_count, q_index, q_mask, q_count,
                     np.stack(masks).astype(np.int32))


def _dot(a, b):
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_t(a, b):     # a @ b.T
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _allowed(masks_ref, mask_id, q_seg, kv_seg):
  return (masks_ref[mask_id] != 0) & (q_seg[:, None] == kv_seg[None, :])


def _forward_kernel(kv_index_ref, kv_mask_ref, kv_count_ref, masks_ref, q_ref, k_ref, v_ref,
                    q_seg_ref, kv_seg_ref, out_ref, lse_ref, *, block):
  i = pl.program_id(2)
  q = q_ref[0, 0]
  q_seg = q_seg_ref[0]
  rows = q.shape[0]

  def visit(t, carry):
    m, l, acc = carry
    j = kv_index_ref[i, t]
    keys = pl.ds(j * block, block)
    k, v = k_ref[0, 0, keys, :], v_ref[0, 0, keys, :]
    allowed = _allowed(masks_ref, kv_mask_ref[i, t], q_seg, kv_seg_ref[0, keys])
    s = _dot_t(q, k)
    m_new = jnp.maximum(m, jnp.max(jnp.where(allowed, s, NO_KEY), axis=1))
    p = jnp.where(allowed, jnp.exp(s - m_new[:, None]), 0.0)
    correction = jnp.exp(m - m_new)
    return (m_new, l * correction + jnp.sum(p, axis=1),
            acc * correction[:, None] + _dot(p.astype(v.dtype), v))

  init = (jnp.full((rows,), NO_KEY, jnp.float32), jnp.zeros((rows,), jnp.float32),
          jnp.zeros((rows, v_ref.shape[-1]), jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, kv_count_ref[i], visit, init)
  has_key = l > 0
  out_ref[0, 0] = (acc / jnp.where(has_key, l, 1.0)[:, None]).astype(out_ref.dtype)
  lse_ref[0, 0] = jnp.where(has_key, m + jnp.log(jnp.where(has_key, l, 1.0)), -jnp.inf)


def _dq_kernel(kv_index_ref, kv_mask_ref, kv_count_ref, masks_ref, q_ref, k_ref, v_ref,
               q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dq_ref, *, block):
  i = pl.program_id(2)
  q, do = q_ref[0, 0], do_ref[0, 0]
  lse, delta, q_seg = lse_ref[0, 0], delta_ref[0, 0], q_seg_ref[0]

  def visit(t, dq):
    j = kv_index_ref[i, t]
    keys = pl.ds(j * block, block)
    k, v = k_ref[0, 0, keys, :], v_ref[0, 0, keys, :]
    allowed = _allowed(masks_ref, kv_mask_ref[i, t], q_seg, kv_seg_ref[0, keys])
    p = jnp.where(allowed, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)
    ds = p * (_dot_t(do, v) - delta[:, None])
    return dq + _dot(ds.astype(k.dtype), k)

  dq = jax.lax.fori_loop(0, kv_count_ref[i], visit,
                         jnp.zeros((q.shape[0], q.shape[1]), jnp.float32))
  dq_ref[0, 0] = dq.astype(dq_ref.dtype)


def _dkdv_kernel(q_index_ref, q_mask_ref, q_count_ref, masks_ref, q_ref, k_ref, v_ref,
                 q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, block):
  j = pl.program_id(2)
  k, v, kv_seg = k_ref[0, 0], v_ref[0, 0], kv_seg_ref[0]

  def visit(t, carry):
    dk, dv = carry
    i = q_index_ref[j, t]
    queries = pl.ds(i * block, block)
    q, do = q_ref[0, 0, queries, :], do_ref[0, 0, queries, :]
    lse, delta = lse_ref[0, 0, queries], delta_ref[0, 0, queries]
    allowed = _allowed(masks_ref, q_mask_ref[j, t], q_seg_ref[0, queries], kv_seg)
    p = jnp.where(allowed, jnp.exp(_dot_t(q, k) - lse[:, None]), 0.0)      # [bq, bk]
    ds = p * (_dot_t(do, v) - delta[:, None])
    return (dk + _dot(ds.T.astype(q.dtype), q), dv + _dot(p.T.astype(do.dtype), do))

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = jax.lax.fori_loop(0, q_count_ref[j], visit, (zeros, zeros))
  dk_ref[0, 0] = dk.astype(dk_ref.dtype)
  dv_ref[0, 0] = dv.astype(dv_ref.dtype)


def _padded_tables(tables: BlockTables) -> tuple:
  """The tables as int32 arrays, each dimension padded to a power of two (Triton blocks)."""
  def pad(a):
    shape = tuple(1 << max(0, int(d - 1).bit_length()) for d in a.shape)
    out = np.zeros(shape, np.int32)
    out[tuple(slice(0, d) for d in a.shape)] = a
    return jnp.asarray(out)
  return tuple(pad(a) for a in (tables.kv_index, tables.kv_mask, tables.kv_count, tables.q_index,
                                tables.q_mask, tables.q_count, tables.masks))


def _whole(shape):
  return pl.BlockSpec(shape, lambda b, h, i: (0,) * len(shape))


def _specs(tables, block, n, d):
  """BlockSpecs: the tables whole; q-side blocks of `block` rows; k, v, segments whole."""
  table_specs = [_whole(t.shape) for t in tables]
  row = pl.BlockSpec((1, 1, block, d), lambda b, h, i: (b, h, i, 0))
  whole_row = pl.BlockSpec((1, 1, n, d), lambda b, h, i: (b, h, 0, 0))
  seg_block = pl.BlockSpec((1, block), lambda b, h, i: (b, i))
  seg_whole = pl.BlockSpec((1, n), lambda b, h, i: (b, 0))
  stat_block = pl.BlockSpec((1, 1, block), lambda b, h, i: (b, h, i))
  stat_whole = pl.BlockSpec((1, 1, n), lambda b, h, i: (b, h, 0))
  return table_specs, row, whole_row, seg_block, seg_whole, stat_block, stat_whole


def _forward(rule, block, interpret, q, k, v, q_seg, kv_seg):
  b, h, n, d = q.shape
  tables = _padded_tables(block_tables(rule, n, block))
  forward_tables = (tables[0], tables[1], tables[2], tables[6])
  specs, row, whole_row, seg_block, seg_whole, stat_block, _ = _specs(forward_tables, block, n, d)
  return pl.pallas_call(
      functools.partial(_forward_kernel, block=block), grid=(b, h, n // block),
      in_specs=specs + [row, whole_row, whole_row, seg_block, seg_whole],
      out_specs=[row, stat_block],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, n), jnp.float32)],
      interpret=interpret, compiler_params=TRITON)(*forward_tables, q, k, v, q_seg, kv_seg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attention(rule, block, interpret, q, k, v, q_seg, kv_seg):
  return _forward(rule, block, interpret, q, k, v, q_seg, kv_seg)[0]


def _attention_fwd(rule, block, interpret, q, k, v, q_seg, kv_seg):
  out, lse = _forward(rule, block, interpret, q, k, v, q_seg, kv_seg)
  return out, (q, k, v, q_seg, kv_seg, out, lse)


def _attention_bwd(rule, block, interpret, residuals, d_out):
  q, k, v, q_seg, kv_seg, out, lse = residuals
  b, h, n, d = q.shape
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)    # [b, h, n]
  tables = _padded_tables(block_tables(rule, n, block))
  forward_tables = (tables[0], tables[1], tables[2], tables[6])
  backward_tables = (tables[3], tables[4], tables[5], tables[6])
  specs, row, whole_row, seg_block, seg_whole, stat_block, stat_whole = _specs(
      forward_tables, block, n, d)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, block=block), grid=(b, h, n // block),
      in_specs=specs + [row, whole_row, whole_row, seg_block, seg_whole, row, stat_block,
                        stat_block],
      out_specs=row, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      interpret=interpret, compiler_params=TRITON)(
          *forward_tables, q, k, v, q_seg, kv_seg, d_out, lse, delta)
  specs = [_whole(t.shape) for t in backward_tables]
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, block=block), grid=(b, h, n // block),
      in_specs=specs + [whole_row, row, row, seg_whole, seg_block, whole_row, stat_whole,
                        stat_whole],
      out_specs=[row, row],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      interpret=interpret, compiler_params=TRITON)(
          *backward_tables, q, k, v, q_seg, kv_seg, d_out, lse, delta)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def masked_kernel(backend: str):
  """The kernel of static masks on slots that `backend` names ('splash' or 'pallas_gpu');
  both take `(q, k, v, segment_ids, valid, mask=rule | left=, right=, interpret=)`."""
  return block_sparse_attention if backend == 'pallas_gpu' else splash_attention


def block_sparse_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                           valid: jax.Array, *, left: Optional[int] = None,
                           right: Optional[int] = 0, mask=None, block: int = DEFAULT_BLOCK,
                           interpret: Optional[bool] = None) -> jax.Array:
  """Masked softmax attention within one chunk, visiting only the blocks `mask` keeps.

  Args:
    q: `[batch, chunk, heads, head_dim]`, already scaled.
    k, v: `[batch, chunk, heads, head_dim]`.
    segment_ids: `[batch, chunk]` int32 document ids; valid: `[batch, chunk]` bool keys.
    left, right: the window `Window(left, right)` when `mask` is None (as splash).
    mask: a rule on slot ids (splash_kernels' rules) for every head, or one per head.
    block: query and key block (a power of two >= 16 for Triton).
    interpret: Pallas interpret mode (None: off on GPU only).
  Returns:
    `[batch, chunk, heads, head_dim]` in q's dtype; rows with no allowed key are 0.
  """
  batch, chunk, heads, _ = q.shape
  interpret = jax.default_backend() != 'gpu' if interpret is None else interpret
  length = -(-chunk // block) * block
  pad = length - chunk
  absent = jnp.min(segment_ids, axis=1, keepdims=True) - 1          # no real query has it
  in_chunk = jnp.arange(length) < chunk
  padded = jnp.pad(segment_ids, ((0, 0), (0, pad)))
  q_seg = jnp.where(in_chunk, padded, absent).astype(jnp.int32)
  kv_seg = jnp.where(in_chunk & jnp.pad(valid, ((0, 0), (0, pad))), padded,
                     absent - 1).astype(jnp.int32)    # padded queries see no key either
  heads_major = lambda a: jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  qh, kh, vh = heads_major(q), heads_major(k), heads_major(v)
  groups = {}
  for head, rule in enumerate(head_rules(Window(left, right) if mask is None else mask, heads)):
    groups.setdefault(rule, []).append(head)
  outs, order = [], []
  for rule, members in groups.items():
    pick = (lambda a: a) if len(members) == heads else (lambda a, m=members: a[:, m])
    outs.append(_attention(rule, block, bool(interpret), pick(qh), pick(kh), pick(vh),
                           q_seg, kv_seg))
    order += members
  out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
  if len(outs) > 1:
    out = out[:, [order.index(h) for h in range(heads)]]
  return out.transpose(0, 2, 1, 3)[:, :chunk]

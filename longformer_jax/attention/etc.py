"""ETC global-local attention (Ainslie et al., 2020, section 3): g2g, g2l, l2g and l2l.

Layout within the call contract (docs/design.md, contract 1; docs/variants.md,
ETC). The *global input* is the chunk's tokens flagged in `ctx.global_flags`,
the first `max_global` flagged real tokens of the row (earliest first),
gathered to `[batch, G, ...]` with their positions, documents and valid bits;
the *long input* is every other token, left in its chunk slot (a global slot
is never a long key, and its output row is the global query's). Projections
are shared by both inputs; positions come only from relative position labels
(no RoPE). With positions `p`, documents, the rank `r` of a global token
among the row's global tokens (0, 1, ...) and the *sentence* `s(t)` of a
token (the rank of the latest global token at or before it in its document,
-1 if none; a global token's sentence is itself):

  l2l  long i -> long j     |p_j - p_i| <= radius         label clip(p_j - p_i, +-k) + k
  g2g  global -> global     always                        label clip(r_j - r_i, +-k) + k
  l2g  long i -> global j   'all', or s(i) == r_j         label SAME if s(i) == r_j else OTHER
  g2l  global i -> long j   'all', or r_i == s(j)         label SAME if r_i == s(j) else OTHER

with k = `radius`, SAME = 2k + 1, OTHER = 2k + 2 (the special labels of the
structured pieces, section 3.3). On top of every piece: same document, a
real key, and, only under `model.causal = True` (a decoder LM; ETC itself is
an encoder), p_j <= p_i: causal is not refused, since the contract suite
builds every variant from the LM's default `causal = True`, and this keeps
such an LM from seeing the future. The `max_global` budget is per row and
chunk, shared by the documents of the chunk, earliest first. Each label l
has a learned vector a_l per head, added to the keys as in Shaw et al.
(2018): e_ij = q_i . (k_j + a_{l_ij}) / sqrt(d) (paper, section 3.1). A
query with no allowed key gives zeros.

Blocked, never an n x n array: the long input is cut into blocks of
min(radius, n) slots; each long query block attends, in one softmax, to its
own and neighbouring blocks (the l2l window, masked to the radius) and to
the G gathered global tokens (l2g): O(n * (3k + G)). The G global queries
attend to the G globals and the whole chunk (g2g + g2l): O(n * G).
"""

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import block_sparse, global_tokens, projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.config.section import Section

STRUCTURES = ('all', 'sentence')


@dataclasses.dataclass(frozen=True)
class ETCConfig(Section):
  """`config.model.etc`; an encoder (`model.causal = False`); causal=True masks by position."""
  radius: int = 64                # k: l2l window radius and clipping distance of the labels
  max_global: int = 64            # G: most flagged tokens made global per row and chunk
  structure: str = 'all'          # all: l2g / g2l see every global / long token of the document
                                  # sentence: only their own sentence's (see the module docstring)

  def validate(self, env) -> None:
    self.require(self.radius >= 1, 'radius', 'must be >= 1')
    self.require(self.max_global >= 0, 'max_global', 'must be >= 0 (0: no global input)')
    self.require(self.structure in STRUCTURES, 'structure', f'must be one of {list(STRUCTURES)}')


def num_labels(radius: int) -> int:
  """2k + 1 clipped distances, then SAME and OTHER."""
  return 2 * radius + 3


def distance_label(delta: jax.Array, radius: int) -> jax.Array:
  return jnp.clip(delta, -radius, radius) + radius


def take_labels(rel_logits: jax.Array, labels: jax.Array) -> jax.Array:
  """`rel_logits [..., q, h, L]` at `labels [..., q, k]` (broadcasting) -> `[..., h, q, k]`."""
  shape = labels.shape[:-1] + (rel_logits.shape[-2], labels.shape[-1])
  picked = jnp.take_along_axis(rel_logits, jnp.broadcast_to(labels[..., None, :], shape), axis=-1)
  return jnp.moveaxis(picked, -2, -3)


def two_labels(rel_logits: jax.Array, same: jax.Array, radius: int) -> jax.Array:
  """SAME / OTHER logits: `rel_logits [..., q, h, L]`, `same [..., q, k]` -> `[..., h, q, k]`."""
  pick = lambda label: jnp.moveaxis(rel_logits[..., label], -1, -2)[..., None]   # [..., h, q, 1]
  return jnp.where(same[..., None, :, :], pick(2 * radius + 1), pick(2 * radius + 2))


class GlobalInput(NamedTuple):
  """The chunk's global tokens: `slots`, `found` `[batch, G]` (earliest first; unused entries
  have slot n and `found` False); `is_global`, `sentence` `[batch, n]`; `rank` `[batch, G]`."""
  slots: jax.Array
  found: jax.Array
  is_global: jax.Array
  sentence: jax.Array
  rank: jax.Array


def select_globals(flags: jax.Array, valid: jax.Array, segment_ids: jax.Array,
                   max_global: int) -> GlobalInput:
  """The first `max_global` flagged real tokens of each row, and every token's sentence.

  The sentence of a token is the rank of the latest global token at or before
  it in its document, -1 if there is none (a global token's is its own rank).
  """
  n = flags.shape[1]
  slots, found = global_tokens.first_global_slots(flags & valid, max_global)
  is_global = global_tokens.global_key_flags(slots, n)
  rank = jnp.cumsum(is_global, axis=1) - 1                          # of the latest global
  latest = jax.lax.cummax(jnp.where(is_global, jnp.arange(n), -1), axis=1)
  safe = jnp.maximum(latest, 0)
  in_document = (latest >= 0) & (jnp.take_along_axis(segment_ids, safe, axis=1) == segment_ids)
  sentence = jnp.where(in_document, jnp.take_along_axis(rank, safe, axis=1), -1)
  return GlobalInput(slots, found, is_global, sentence, global_tokens.gather_slots(rank, slots))


def always(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.ones(jnp.broadcast_shapes(a.shape, b.shape), bool)


def long_queries(q, k, v, rel_logits, positions, segment_ids, valid, glob: GlobalInput, *,
                 radius: int, linked, in_time) -> jax.Array:
  """l2l (blocked window) and l2g in one softmax per long query -> `[batch, n, heads, head_dim]`.

  `rel_logits [batch, n, heads, L]` holds q . a_l; `linked` and `in_time` are the
  structure and causal rules (broadcasting). Rows of global slots are overwritten later.
  """
  n = q.shape[1]
  block = max(1, min(radius, n))
  context = block_sparse.blocked_context(positions, segment_ids, valid & ~glob.is_global, block)
  padded = context.rel.shape[1]
  blocks = lambda a, value=0: block_sparse.to_blocks(block_sparse.pad_length(a, padded, value),
                                                     block)
  q_blocks, k_blocks, v_blocks, rel_blocks = (blocks(a) for a in (q, k, v, rel_logits))
  q_rel, q_seg = blocks(context.rel), blocks(context.segments)

  # l2l: the query block's neighbour blocks, masked to the radius.
  span = min(-(-radius // block), padded // block - 1)
  offsets = tuple(range(-span, span + 1))
  near = lambda a, fill=0: block_sparse.neighbour_blocks(a, offsets, fill=fill)
  k_rel, k_seg, k_valid = near(q_rel, -1), near(q_seg, -1), near(blocks(context.valid), False)
  q_r, k_r = q_rel[..., :, None], k_rel[..., None, :]
  window_mask = (block_sparse.document_mask(q_seg[..., :, None], k_seg[..., None, :],
                                            k_valid[..., None, :])
                 & (jnp.abs(k_r - q_r) <= radius) & in_time(q_r, k_r))
  window_values = near(v_blocks)
  window_logits = (jnp.einsum('bnqhd,bnkhd->bhnqk', q_blocks, near(k_blocks))
                   + jnp.moveaxis(take_labels(rel_blocks, distance_label(k_r - q_r, radius)),
                                  2, 1))
  key_sets = [block_sparse.KeySet(window_logits, window_mask,
                                  lambda w: jnp.einsum('bhnqk,bnkhd->bnqhd', w, window_values))]
  if glob.slots.shape[1]:
    # l2g: every long query over the G gathered global keys.
    take = lambda a: global_tokens.gather_slots(a, glob.slots)[:, None, None]   # [b, 1, 1, G]
    g_k, g_v = global_tokens.gather_slots(k, glob.slots), global_tokens.gather_slots(v, glob.slots)
    q_sentence = blocks(glob.sentence, -1)[..., None]
    g_rank = glob.rank[:, None, None, :]
    l2g_mask = (block_sparse.document_mask(q_seg[..., None], take(segment_ids),
                                           glob.found[:, None, None, :])
                & linked(q_sentence, g_rank)
                & in_time(q_rel[..., None], take(positions - positions[:, :1])))
    l2g_logits = (jnp.einsum('bnqhd,bkhd->bhnqk', q_blocks, g_k)
                  + jnp.moveaxis(two_labels(rel_blocks, q_sentence == g_rank, radius), 2, 1))
    key_sets.append(block_sparse.KeySet(l2g_logits, l2g_mask,
                                        lambda w: jnp.einsum('bhnqk,bkhd->bnqhd', w, g_v)))
  return block_sparse.from_blocks(block_sparse.attend_key_sets(key_sets, v.dtype))[:, :n]


def global_queries(q, k, v, rel_logits, positions, segment_ids, valid, glob: GlobalInput, *,
                   radius: int, linked, in_time) -> jax.Array:
  """g2g and g2l in one softmax per global query -> `[batch, G, heads, head_dim]`; O(n * G)."""
  take = lambda a: global_tokens.gather_slots(a, glob.slots)
  g_q, g_k, g_v, g_rel_logits = take(q), take(k), take(v), take(rel_logits)
  g_pos, g_seg, g_rank = take(positions), take(segment_ids), glob.rank
  g2g_labels = distance_label(g_rank[:, None, :] - g_rank[:, :, None], radius)
  g2g_logits = jnp.einsum('bghd,bkhd->bhgk', g_q, g_k) + take_labels(g_rel_logits, g2g_labels)
  g2g_mask = ((g_seg[:, :, None] == g_seg[:, None, :]) & glob.found[:, None, :]
              & in_time(g_pos[:, :, None], g_pos[:, None, :]))
  sentence = glob.sentence[:, None, :]
  g2l_logits = (jnp.einsum('bghd,bkhd->bhgk', g_q, k)
                + two_labels(g_rel_logits, g_rank[:, :, None] == sentence, radius))
  g2l_mask = ((g_seg[:, :, None] == segment_ids[:, None, :])
              & (valid & ~glob.is_global)[:, None, :] & linked(g_rank[:, :, None], sentence)
              & in_time(g_pos[:, :, None], positions[:, None, :]))
  weights = masked_softmax(jnp.concatenate([g2g_logits, g2l_logits], axis=-1),
                           jnp.concatenate([g2g_mask, g2l_mask], axis=-1)).astype(v.dtype)
  num_global = g_k.shape[1]
  return (jnp.einsum('bhgk,bkhd->bghd', weights[..., :num_global], g_v)
          + jnp.einsum('bhgk,bkhd->bghd', weights[..., num_global:], v))


def etc_attention(q: jax.Array, k: jax.Array, v: jax.Array, rel_keys: jax.Array,
                  positions: jax.Array, segment_ids: jax.Array, valid: jax.Array, global_flags,
                  *, radius: int, max_global: int, structure: str,
                  causal: bool = False) -> jax.Array:
  """Blocked ETC attention over one chunk.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    rel_keys: `[num_labels(radius), heads, head_dim]`, the label vectors a_l.
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
    global_flags: `[batch, n]` bool or None (no global input).
  Returns:
    `[batch, n, heads, head_dim]`.
  """
  n = q.shape[1]
  num_global = 0 if global_flags is None else min(max_global, n)
  flags = jnp.zeros_like(valid) if global_flags is None else global_flags
  glob = select_globals(flags, valid, segment_ids, num_global)
  # q . a_l for every label, [b, n, h, L]: e_ij = q_i . (k_j + a_l) (Shaw et al., 2018, eq. 4).
  rel_logits = jnp.einsum('bnhd,lhd->bnhl', q, rel_keys.astype(q.dtype))
  rules = dict(radius=radius, linked=always if structure == 'all' else jnp.equal,
               in_time=(lambda q_pos, k_pos: k_pos <= q_pos) if causal else always)
  out = long_queries(q, k, v, rel_logits, positions, segment_ids, valid, glob, **rules)
  if not num_global:
    return out
  g_out = global_queries(q, k, v, rel_logits, positions, segment_ids, valid, glob, **rules)
  rows = jnp.where(glob.found[..., None, None], g_out.astype(out.dtype),
                   global_tokens.gather_slots(out, glob.slots))
  return global_tokens.scatter_slots(out, glob.slots, rows)


class ETCAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`.

  Fields: `config` (`ETCConfig`, the layer's `model.etc`), `shared` (`SharedSettings`: heads,
  `causal`), `dtype`.
  """
  Config = ETCConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: ETCConfig = ETCConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: ETCConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    q, k, v = projections.chunk_qkv(x, shared.num_heads, shared.head_dim, self.dtype)
    init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02),
                                        (None, 'heads', 'head_dim'))
    rel_keys = self.param('relative_keys', init,
                          (num_labels(config.radius), shared.num_heads, shared.head_dim),
                          jnp.float32)
    out = etc_attention(q, k, v, rel_keys, ctx.positions, ctx.segment_ids, ctx.valid,
                        ctx.global_flags, radius=config.radius, max_global=config.max_global,
                        structure=config.structure, causal=shared.causal)
    out = nn.with_logical_constraint(out.astype(self.dtype),
                                     ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}

"""BlockBERT blockwise attention (Qiu et al., 2020): one key block per query block and head.

Within the chunk (stateless), rotary positions as in attention/vanilla/attention.py. The chunk of
n tokens is cut into b blocks of L = ceil(n / b) slots (the last padded);
b is the length of the permutations in the config. Head h uses a map pi_h of
the blocks, and, with blk(t) = t // L on positions relative to the chunk's
first token, query i may attend to key j (same document, real key) iff

  blk(j) = pi_h(blk(i))          (the paper's blockwise mask: M[i, j] = 1 iff pi(i) = j)

Settings: `config.model.blockbert` (`BlockBERTConfig`). `permutations` lists
maps of the b blocks, `;` between maps, e.g. '0,1;1,0' (identity and the
shift of 2 blocks, the paper's default for b = 2). The heads are split evenly
between the listed maps in order (map m takes heads [m H / P, (m + 1) H / P)
for P maps); a map may be listed twice to give it more heads, e.g.
'0,1;0,1;0,1;1,0' gives 3/4 of the heads the identity (the paper compares
such head assignments).

Bidirectional (`model.causal = False`, the paper's encoder): every map is a
permutation of the b blocks. Causal LM (`model.causal = True`): every map must
be a cyclic shift, pi(i) = (i - s) mod b (as the paper's example
permutations are), and its causal form drops the wrap-around:

  pi_causal(i) = i - s   if i >= s, else no key block (the query gets zeros)

with the causal rule j <= i on top (it only cuts the diagonal block, s = 0).
So the identity head is causal attention within the query's own block and a
shift-s head sees exactly the block s blocks back. This equals the paper's
mask of the shift AND the causal mask (the wrap-around blocks lie wholly in
the future); the blocked path just skips them. A permutation that is not a
shift would leave some query blocks only future keys, so it is refused.

Blocked implementation, never an n x n array: queries `[batch, heads, b, L,
head_dim]` against the key block gathered per head, `[batch, heads, b, L,
head_dim]`: O(n^2 / b) work and memory per head. Masks come from positions,
documents and valid bits of the gathered keys (docs/design.md, contract 2).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core import block_sparse, projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import Section

NO_BLOCK = -1      # a causal map's entry for a query block that has no key block


def parse_maps(text: str) -> tuple:
  """'0,1;1,0' -> ((0, 1), (1, 0)); ValueError if an entry is not an integer."""
  return tuple(tuple(int(entry) for entry in part.split(',')) for part in text.split(';'))


def cyclic_shift(permutation) -> int | None:
  """s if `permutation` is i -> (i - s) mod b, else None."""
  b = len(permutation)
  s = (0 - permutation[0]) % b
  return s if all(p == (i - s) % b for i, p in enumerate(permutation)) else None


def key_block_maps(permutations: str, num_heads: int, causal: bool) -> np.ndarray:
  """`[heads, b]` int32: the key block of each query block per head (NO_BLOCK: none).

  Bidirectional: the listed permutations; causal: their causal forms (module docstring).
  """
  maps = parse_maps(permutations)
  per_map = num_heads // len(maps)
  rows = []
  for permutation in maps:
    b = len(permutation)
    if causal:
      s = cyclic_shift(permutation)
      if s is None:
        raise ConfigError('model.blockbert.permutations',
                          f'{permutations!r} must list cyclic shifts when model.causal is True')
      permutation = tuple(i - s if i >= s else NO_BLOCK for i in range(b))
    rows.extend([permutation] * per_map)
  return np.asarray(rows, np.int32)


@dataclasses.dataclass(frozen=True)
class BlockBERTConfig(Section):
  """`config.model.blockbert`; causal or bidirectional is the shared `model.causal`."""
  permutations: str = '0,1;1,0'   # maps of the b blocks, ';' between maps, heads split evenly

  def validate(self, env) -> None:
    try:
      maps = parse_maps(self.permutations)
    except ValueError:
      maps = None
    self.require(maps is not None, 'permutations',
                 "must be ';'-separated maps of comma-separated block indices, e.g. '0,1;1,0'")
    b = len(maps[0])
    self.require(all(len(m) == b for m in maps), 'permutations',
                 'must list maps of one length (the number of blocks b)')
    self.require(all(sorted(m) == list(range(b)) for m in maps), 'permutations',
                 f'must list permutations of the blocks 0..{b - 1}')
    if env is not None:
      heads = env.model.num_heads
      self.require(heads % len(maps) == 0, 'permutations',
                   f'lists {len(maps)} maps: model.num_heads={heads} must be a multiple of it '
                   f'(heads are split evenly between the maps)')
      self.require(not env.model.causal or all(cyclic_shift(m) is not None for m in maps),
                   'permutations', 'must list cyclic shifts i -> (i - s) mod b when '
                   'model.causal is True (their causal form i -> i - s; docs/variants.md)')


def blockbert_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                        segment_ids: jax.Array, valid: jax.Array, key_blocks: np.ndarray, *,
                        causal: bool) -> jax.Array:
  """Blockwise attention: query block I of head h attends key block `key_blocks[h, I]`.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
    key_blocks: `[heads, b]` int (key_block_maps), a constant; NO_BLOCK: no key block.
    causal: also require key position <= query position.
  Returns:
    `[batch, n, heads, head_dim]`; queries with no allowed key give zeros.
  """
  n, heads = q.shape[1], q.shape[2]
  num_blocks = key_blocks.shape[1]
  block = block_sparse.num_blocks_for(n, num_blocks)           # L = ceil(n / b)
  padded = num_blocks * block
  # Facts of the chunk padded to b * L slots (one "block" of that length).
  context = block_sparse.blocked_context(positions, segment_ids, valid, padded)
  # [batch, n, heads, d] -> [batch, heads, b, L, d]
  to_heads = lambda a: jnp.moveaxis(
      block_sparse.to_blocks(block_sparse.pad_length(a, padded), block), 3, 1)
  q_blocks, k_blocks, v_blocks = to_heads(q), to_heads(k), to_heads(v)
  has_block = jnp.asarray(key_blocks >= 0)                      # [heads, b]
  index = jnp.asarray(np.maximum(key_blocks, 0))
  head = jnp.arange(heads)[:, None]
  keys, values = k_blocks[:, head, index], v_blocks[:, head, index]   # [batch, heads, b, L, d]
  rel, seg, ok = (block_sparse.to_blocks(a, block) for a in context)  # [batch, b, L]
  gather = lambda a: a[:, index]                                # [batch, heads, b, L]
  mask = (block_sparse.document_mask(seg[:, None, :, :, None], gather(seg)[..., None, :],
                                     gather(ok)[..., None, :])
          & has_block[None, :, :, None, None])
  if causal:
    mask &= gather(rel)[..., None, :] <= rel[:, None, :, :, None]
  logits = jnp.einsum('bhnqd,bhnkd->bhnqk', q_blocks, keys)
  weights = masked_softmax(logits, mask).astype(v.dtype)
  out = jnp.einsum('bhnqk,bhnkd->bnqhd', weights, values)
  return block_sparse.from_blocks(out)[:, :n]


class BlockBERTAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`.

  Fields: `config` (`BlockBERTConfig`, the layer's `model.blockbert`), `shared`
  (`SharedSettings`: heads, `causal`), `dtype`.
  """
  Config = BlockBERTConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: BlockBERTConfig = BlockBERTConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: BlockBERTConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    shared = self.shared
    q, k, v = projections.chunk_rotary_qkv(x, ctx, shared.num_heads, shared.head_dim, self.dtype)
    key_blocks = key_block_maps(self.config.permutations, shared.num_heads, shared.causal)
    out = blockbert_attention(q, k, v, ctx.positions, ctx.segment_ids, ctx.valid, key_blocks,
                              causal=shared.causal)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}

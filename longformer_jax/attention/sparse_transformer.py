"""Sparse Transformer attention (Child et al., 2019): strided and fixed factorized patterns.

Causal, within the chunk (stateless), rotary positions as in vanilla.py. Both
patterns are a union of two components, written as rules on the positions
`i` (query) and `j` (key) relative to the chunk's first token, with stride
(block length) `l` and summary length `c`:

  strided_local    0 <= i - j < l                 the previous l positions, self included
  strided_summary  i - j >= 0 and (i - j) % l == 0   every l-th position back
  fixed_local      j <= i and j // l == i // l    the query's own block (eq. A(1) of section 4.3)
  fixed_summary    j <= i and j % l >= l - c      the last c positions of every block

(The paper writes A(1) of the strided pattern as t = max(0, i - l) .. i; we
follow its released code, `matrix_band_part(ones, l - 1, 0)`: l positions.)
Document boundaries and padding are masked on top (a key of another document
or a padded key is never attended).

Settings: `config.model.sparse_transformer` (`SparseTransformerConfig`).
The three integrations of section 4.3 are config choices:

- merged (`integration='merged'`, pattern 'strided' or 'fixed'): every
  head attends to the union of both components, one softmax.
- multihead (`integration='multihead'`): the first num_heads // 2
  heads attend with the local component, the others with the summary one.
- interleaved: one component per layer, e.g.
  `model.layer_schedule.sparse_transformer.pattern = 'strided_local,strided_summary'`
  (resolved per layer by models/layer_schedule.layer_config), with a
  single-component pattern in each layer.

Blocked implementation, never an n x n mask: the chunk is cut into blocks of
l slots (block_sparse.py). Local components slice the query's own block (and,
strided, the previous one): O(n * l). The strided summary transposes the
blocks so that the keys at distance k * l of query (I, a) are column a of
every block: O(n * n / l). The fixed summary gathers the last c slots of every
block once: O(n * c * n / l). With l ~ sqrt(n) both are O(n * sqrt(n)), as in
the paper. In the merged integration the summary set drops the keys that the
local set already holds, so the concatenated key sets are disjoint.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core import block_sparse, cached_context
from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.config.section import Section
from longformer_jax.config.errors import ConfigError

COMPONENTS = ('strided_local', 'strided_summary', 'fixed_local', 'fixed_summary')
UNIONS = {'strided': ('strided_local', 'strided_summary'),
          'fixed': ('fixed_local', 'fixed_summary')}
PATTERNS = tuple(UNIONS) + COMPONENTS
INTEGRATIONS = ('merged', 'multihead')
CAUSAL_ONLY = 'sparse_transformer is causal only (its patterns look back); set it True'


@dataclasses.dataclass(frozen=True)
class SparseTransformerConfig(Section):
  """`config.model.sparse_transformer`; needs the shared `model.causal = True`."""
  pattern: str = 'strided'        # strided | fixed (unions), or one component (PATTERNS)
  stride: int = 16                # l: block length and stride (the paper: l ~ sqrt(chunk))
  summary_len: int = 1            # c: fixed pattern's summary positions per block, 1 <= c <= l
  integration: str = 'merged'     # merged: one softmax over the union | multihead: heads split

  legacy_names = {'sparse_pattern': 'pattern', 'sparse_stride': 'stride',
                  'sparse_summary_len': 'summary_len', 'sparse_integration': 'integration'}

  def validate(self, env) -> None:
    self.require(self.pattern in PATTERNS, 'pattern', f'must be one of {list(PATTERNS)}')
    self.require(self.integration in INTEGRATIONS, 'integration',
                 f'must be one of {list(INTEGRATIONS)} (interleaved: a layer_schedule of '
                 f'pattern, see configs/sparse_transformer.py)')
    self.require(self.stride >= 1, 'stride', 'must be >= 1')
    self.require(1 <= self.summary_len <= self.stride, 'summary_len',
                 f'must be in [1, stride={self.stride}]')
    self.require(self.integration != 'multihead' or self.pattern in UNIONS, 'integration',
                 f"'multihead' splits heads between the two components of 'strided' or "
                 f"'fixed', not pattern {self.pattern!r}")
    if env is not None:
      self.require(self.integration != 'multihead' or env.model.num_heads >= 2, 'integration',
                   f"'multihead' needs at least 2 heads (model.num_heads={env.model.num_heads})")
      if not env.model.causal:
        raise ConfigError('model.causal', f'False: {CAUSAL_ONLY}')


def component_allows(component: str, q_rel: jax.Array, k_rel: jax.Array, stride: int,
                     summary_len: int) -> jax.Array:
  """The component's rule on relative positions (broadcasting int arrays) -> bool."""
  distance = q_rel - k_rel
  causal = distance >= 0
  if component == 'strided_local':
    return causal & (distance < stride)
  if component == 'strided_summary':
    return causal & (distance % stride == 0)
  if component == 'fixed_local':
    return causal & (q_rel // stride == k_rel // stride)
  if component == 'fixed_summary':
    return causal & (k_rel % stride >= stride - summary_len)
  raise ValueError(f'unknown component {component!r}')


def pattern_allows(pattern: str, q_rel: jax.Array, k_rel: jax.Array, stride: int,
                   summary_len: int) -> jax.Array:
  """The union of the pattern's components (the dense-mask rule of a merged head)."""
  allowed = jnp.zeros(jnp.broadcast_shapes(q_rel.shape, k_rel.shape), bool)
  for component in UNIONS.get(pattern, (pattern,)):
    allowed |= component_allows(component, q_rel, k_rel, stride, summary_len)
  return allowed


def column_key_set(q_blocks: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array,
                   context: block_sparse.BlockedContext, block: int, allows) -> block_sparse.KeySet:
  """Query (I, a) attends to slot a of every block J: the keys at multiples of the block back.

  Shapes: `[batch, num_blocks, block, heads, head_dim]` blocks; the set has
  num_blocks keys per query.
  """
  rel = block_sparse.to_blocks(context.rel, block)             # [b, I, a]
  seg = block_sparse.to_blocks(context.segments, block)
  valid = block_sparse.to_blocks(context.valid, block)
  column = lambda a: jnp.swapaxes(a, 1, 2)[:, None]            # [b, 1, a, J]
  mask = (block_sparse.document_mask(seg[..., None], column(seg), column(valid))
          & allows(rel[..., None], column(rel)))
  logits = jnp.einsum('bIahd,bJahd->bhIaJ', q_blocks, k_blocks)
  return block_sparse.KeySet(logits, mask,
                             lambda w: jnp.einsum('bhIaJ,bJahd->bIahd', w, v_blocks))


def summary_key_set(q_blocks: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array,
                    context: block_sparse.BlockedContext, block: int, summary_len: int,
                    allows) -> block_sparse.KeySet:
  """Every query sees the last `summary_len` slots of every block (gathered once)."""
  last = lambda blocks: block_sparse.from_blocks(blocks[:, :, block - summary_len:])
  facts = lambda a: last(block_sparse.to_blocks(a, block))   # [batch, num_blocks * c]
  return block_sparse.gathered_key_set(
      q_blocks, last(k_blocks), last(v_blocks), facts(context.rel), facts(context.segments),
      facts(context.valid), context, block, allows)


def component_key_set(component: str, q_blocks, k_blocks, v_blocks, context, stride: int,
                      summary_len: int, allows) -> block_sparse.KeySet:
  """The blocked key set that holds every key the component can allow."""
  if component == 'strided_local':
    return block_sparse.neighbour_key_set(q_blocks, k_blocks, v_blocks, context, stride, (-1, 0),
                                          allows)
  if component == 'fixed_local':
    return block_sparse.neighbour_key_set(q_blocks, k_blocks, v_blocks, context, stride, (0,),
                                          allows)
  if component == 'strided_summary':
    return column_key_set(q_blocks, k_blocks, v_blocks, context, stride, allows)
  return summary_key_set(q_blocks, k_blocks, v_blocks, context, stride, summary_len, allows)


def union_output(components, q_blocks, k_blocks, v_blocks, context, stride: int,
                 summary_len: int) -> jax.Array:
  """One softmax over the union of `components`; each later set drops earlier sets' keys."""
  key_sets = []
  for index, component in enumerate(components):
    earlier = components[:index]

    def allows(q_rel, k_rel, component=component, earlier=earlier):
      allowed = component_allows(component, q_rel, k_rel, stride, summary_len)
      for other in earlier:
        allowed &= ~component_allows(other, q_rel, k_rel, stride, summary_len)
      return allowed
    key_sets.append(component_key_set(component, q_blocks, k_blocks, v_blocks, context, stride,
                                      summary_len, allows))
  return block_sparse.attend_key_sets(key_sets, v_blocks.dtype)


def sparse_transformer_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                                 segment_ids: jax.Array, valid: jax.Array, *, pattern: str,
                                 stride: int, summary_len: int = 1,
                                 integration: str = 'merged') -> jax.Array:
  """Blocked factorized attention.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
    pattern: one of PATTERNS; integration: 'merged' or 'multihead' (unions only).
  Returns:
    `[batch, n, heads, head_dim]`.
  """
  n = q.shape[1]
  context = block_sparse.blocked_context(positions, segment_ids, valid, stride)
  padded = context.rel.shape[1]
  q_blocks, k_blocks, v_blocks = (
      block_sparse.to_blocks(block_sparse.pad_length(a, padded), stride) for a in (q, k, v))
  components = UNIONS.get(pattern, (pattern,))
  if integration == 'multihead' and len(components) == 2:
    split = q.shape[2] // 2
    heads = (slice(0, split), slice(split, None))
    out = jnp.concatenate(
        [union_output((component,), q_blocks[..., h, :], k_blocks[..., h, :],
                      v_blocks[..., h, :], context, stride, summary_len)
         for component, h in zip(components, heads)], axis=-2)
  else:
    out = union_output(components, q_blocks, k_blocks, v_blocks, context, stride, summary_len)
  return block_sparse.from_blocks(out)[:, :n]


class SparseTransformerAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`."""
  Config = SparseTransformerConfig
  reads_mem_len = False           # stateless: attends within the chunk

  num_heads: int
  head_dim: int
  d_model: int
  pattern: str = 'strided'
  stride: int = 16
  summary_len: int = 1
  integration: str = 'merged'
  dtype: jnp.dtype = jnp.float32

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, dtype, name=None):
    if not config.causal:
      # models/encoder.py makes any model bidirectional after the config was checked.
      raise ConfigError('model.causal', f'False: {CAUSAL_ONLY}')
    section = config.sparse_transformer
    return cls(num_heads=config.num_heads, head_dim=config.head_dim, d_model=config.d_model,
               pattern=section.pattern, stride=section.stride, summary_len=section.summary_len,
               integration=section.integration, dtype=dtype, name=name)

  @staticmethod
  def init_state(config: ml_collections.ConfigDict, batch_size: int, dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    q, k, v = cached_context.chunk_rotary_qkv(x, ctx, self.num_heads, self.head_dim, self.dtype)
    out = sparse_transformer_attention(q, k, v, ctx.positions, ctx.segment_ids, ctx.valid,
                                       pattern=self.pattern, stride=self.stride,
                                       summary_len=self.summary_len,
                                       integration=self.integration)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return cached_context.project_output(out, self.d_model, self.dtype), state, {}

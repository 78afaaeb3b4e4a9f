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

The three integrations of section 4.3 are config choices:

- merged (`sparse_integration='merged'`, pattern 'strided' or 'fixed'): every
  head attends to the union of both components, one softmax.
- multihead (`sparse_integration='multihead'`): the first num_heads // 2
  heads attend with the local component, the others with the summary one.
- interleaved: one component per layer, e.g.
  `model.layer_schedule.sparse_pattern = 'strided_local,strided_summary'`
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

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core import block_sparse, cached_context
from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.config_errors import require

COMPONENTS = ('strided_local', 'strided_summary', 'fixed_local', 'fixed_summary')
UNIONS = {'strided': ('strided_local', 'strided_summary'),
          'fixed': ('fixed_local', 'fixed_summary')}
PATTERNS = tuple(UNIONS) + COMPONENTS
INTEGRATIONS = ('merged', 'multihead')


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


def check_settings(pattern: str, integration: str, stride: int, summary_len: int,
                   num_heads: int, causal: bool) -> None:
  """Raises ConfigError naming the model key of a bad setting."""
  require(pattern in PATTERNS, 'model.sparse_pattern',
          f'unknown pattern {pattern!r}; choose one of {list(PATTERNS)}')
  require(integration in INTEGRATIONS, 'model.sparse_integration',
          f'must be one of {list(INTEGRATIONS)}, got {integration!r}')
  require(isinstance(stride, int) and stride > 0, 'model.sparse_stride',
          f'must be a positive integer, got {stride!r}')
  require(isinstance(summary_len, int) and 1 <= summary_len <= stride, 'model.sparse_summary_len',
          f'must be an integer in [1, sparse_stride={stride}], got {summary_len!r}')
  if integration == 'multihead':
    require(pattern in UNIONS, 'model.sparse_integration',
            f"'multihead' splits heads between the two components of 'strided' or 'fixed', "
            f'got pattern {pattern!r}')
    require(num_heads >= 2, 'model.num_heads',
            f"'multihead' integration needs at least 2 heads, got {num_heads}")
  require(causal, 'model.causal', 'sparse_transformer is causal only')


class SparseTransformerAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`."""
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
    """Keys: sparse_pattern, sparse_integration, sparse_stride, sparse_summary_len (module doc)."""
    settings = dict(pattern=config.get('sparse_pattern', 'strided'),
                    integration=config.get('sparse_integration', 'merged'),
                    stride=config.get('sparse_stride', 16),
                    summary_len=config.get('sparse_summary_len', 1))
    check_settings(**settings, num_heads=config.num_heads, causal=config.get('causal', True))
    return cls(num_heads=config.num_heads, head_dim=config.head_dim, d_model=config.d_model,
               dtype=dtype, name=name, **settings)

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

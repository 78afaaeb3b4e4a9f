"""Sparse Transformer attention (Child et al., 2019): strided and fixed factorized patterns.

Within the chunk (stateless), rotary positions as in attention/vanilla/attention.py; causal
(a language model) or bidirectional (an encoder), as the shared `model.causal`. Both
patterns are a union of two components, written as rules on the positions
`i` (query) and `j` (key) relative to the chunk's first token, with stride
(block length) `l` and summary length `c`:

  strided_local    0 <= i - j < l                 the previous l positions, self included
  strided_summary  i - j >= 0 and (i - j) % l == 0   every l-th position back
  fixed_local      j <= i and j // l == i // l    the query's own block (eq. A(1) of section 4.3)
  fixed_summary    j <= i and j % l >= l - c      the last c positions of every block

(The paper writes A(1) of the strided pattern as t = max(0, i - l) .. i; we
follow its released code, `matrix_band_part(ones, l - 1, 0)`: l positions.)
Bidirectional (`model.causal=False`: the encoders of models/encoder.py; the Long
Range Arena benchmark ran the Sparse Transformer as an encoder), the same rules mirrored:

  strided_local    |i - j| < l                    l - 1 positions on either side, self included
  strided_summary  (i - j) % l == 0               every l-th position, both directions
  fixed_local      j // l == i // l               the query's whole block
  fixed_summary    j % l >= l - c                 the last c positions of every block, before
                                                  and after

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

Blocked implementation, never an n x n mask: the chunk is padded to whole
blocks of l slots (block_sparse.py). Each component is one *part*, an
attention over the keys it can allow that returns its output and float32
log-sum-exp; the parts of a union merge exactly into one softmax
(partial_softmax.merge_parts), each later part dropping the keys of the
earlier ones so that the parts are disjoint. The local and fixed-summary
parts scan over query steps of Q = 128 slots (the largest divisor of l up to
128; block_scan.py: one step's `[batch, heads, Q, keys]` scores stay in
cache, the backward pass recomputes them):

  strided_local    step [t, t + Q) sees keys [t - l, t + Q): Q + l keys for l useful
                   (bidirectional: [t - l, t + Q + l), Q + 2 l keys for 2 l - 1)
  fixed_local      sub-block s of its block sees the block's first (s + 1) Q
                   keys, one scan per s: (l + Q) / 2 keys per query, ~l / 2 useful
                   (bidirectional: every step sees its whole block, one scan, l keys)
  fixed_summary    the last c slots of every block, gathered once (n c / l keys);
                   the blocks are cut into SUMMARY_GROUPS runs, and a run's
                   queries see the summary prefix up to the run's last block,
                   so the keys after a query are computed within its run only
                   (bidirectional: every query sees all n c / l, one run)
  strided_summary  query (I, a) sees slot a of every block: per head and
                   column a a small dense `[blocks, blocks]` attention,
                   materialised (n * n / l scores in all; both directions alike)

With l ~ sqrt(n) the summaries are O(n * sqrt(n)), as in the paper; the
local parts are O(n * l), in both forms. With `model.attention_backend` resolving to
splash (TPU under `auto`) or pallas_gpu, the same rules (causal or bidirectional) run
as one kernel with a mask on slots (attention/sparse_transformer/splash.py;
docs/kernels.md).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core.block_sparse_flash import masked_kernel
from longformer_jax.attention.core import block_scan, block_sparse, partial_softmax, projections
from longformer_jax.attention.sparse_transformer import splash as sparse_splash
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.section import Section

COMPONENTS = ('strided_local', 'strided_summary', 'fixed_local', 'fixed_summary')
UNIONS = {'strided': ('strided_local', 'strided_summary'),
          'fixed': ('fixed_local', 'fixed_summary')}
PATTERNS = tuple(UNIONS) + COMPONENTS
INTEGRATIONS = ('merged', 'multihead')
SUMMARY_GROUPS = 8              # fixed summary (causal): runs of blocks sharing one summary prefix


@dataclasses.dataclass(frozen=True)
class SparseTransformerConfig(Section):
  """`config.model.sparse_transformer`; causal or bidirectional is the shared `model.causal`."""
  pattern: str = 'strided'        # strided | fixed (unions), or one component (PATTERNS)
  stride: int = 16                # l: block length and stride (the paper: l ~ sqrt(chunk))
  summary_len: int = 1            # c: fixed pattern's summary positions per block, 1 <= c <= l
  integration: str = 'merged'     # merged: one softmax over the union | multihead: heads split

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


def component_allows(component: str, q_rel: jax.Array, k_rel: jax.Array, stride: int,
                     summary_len: int, causal: bool = True) -> jax.Array:
  """The component's rule on relative positions (broadcasting int arrays) -> bool.

  Causal: the rules of the module docstring; bidirectional: the same without
  `j <= i` (the local stride window two-sided: |i - j| < l).
  """
  distance = q_rel - k_rel
  if component == 'strided_local':
    allowed = (distance < stride) & (distance > -stride)
  elif component == 'strided_summary':
    allowed = distance % stride == 0          # floor modulo: also for keys after the query
  elif component == 'fixed_local':
    allowed = q_rel // stride == k_rel // stride
  elif component == 'fixed_summary':
    allowed = k_rel % stride >= stride - summary_len
  else:
    raise ValueError(f'unknown component {component!r}')
  return allowed & (distance >= 0) if causal else allowed


def pattern_allows(pattern: str, q_rel: jax.Array, k_rel: jax.Array, stride: int,
                   summary_len: int, causal: bool = True) -> jax.Array:
  """The union of the pattern's components (the dense-mask rule of a merged head)."""
  allowed = jnp.zeros(jnp.broadcast_shapes(q_rel.shape, k_rel.shape), bool)
  for component in UNIONS.get(pattern, (pattern,)):
    allowed |= component_allows(component, q_rel, k_rel, stride, summary_len, causal)
  return allowed


def query_len(stride: int) -> int:
  """Q, the queries of one scan step: the largest divisor of the stride up to 128."""
  return max(d for d in range(1, min(stride, 128) + 1) if stride % d == 0)


def _facts(context: block_sparse.BlockedContext, front: int = 0, back: int = 0) -> tuple:
  """`(rel, segments, valid)` `[b, front + padded + back]`, the added slots invalid."""
  pad = lambda x, value: jnp.pad(x, ((0, 0), (front, back)), constant_values=value)
  return pad(context.rel, -1), pad(context.segments, -1), pad(context.valid, False)


def _pad_slots(x: jax.Array, front: int, back: int = 0) -> jax.Array:
  """Pads axis 2 of heads-major `[b, h, L, d]` with `front` zero slots before, `back` after."""
  return jnp.pad(x, ((0, 0), (0, 0), (front, back), (0, 0)))


def _scan_part(spans, q_steps, q_facts, starts, kvs, facts):
  """`block_scan.span_attention` -> `(out [b, steps * Q, h, d], lse [b, steps * Q, h])`."""
  out, lse = block_scan.span_attention(block_scan.ScanGeometry(tuple(spans)), q_steps, q_facts,
                                       jnp.asarray(starts, jnp.int32), kvs, facts)
  return out, lse


def strided_local_part(q, k, v, context, stride: int, allows, causal: bool = True):
  """Query step [t, t + Q) sees keys [t - stride, t + Q): Q + stride keys, stride useful;
  bidirectional, keys [t - stride, t + Q + stride): Q + 2 stride keys, 2 stride - 1 useful."""
  q_len = query_len(stride)
  steps = q.shape[1] // q_len
  back = 0 if causal else stride
  kv = tuple(_pad_slots(block_scan.heads_major(x), stride, back) for x in (k, v))
  span = block_scan.Span(kv=0, facts=0, length=q_len + stride + back, allows=allows)
  starts = (np.arange(steps) * q_len)[:, None]
  out, lse = _scan_part([span], block_scan.q_steps_of(q, q_len),
                        tuple(block_scan.steps_of(a, q_len) for a in context[:2]), starts, (kv,),
                        (_facts(context, stride, back),))
  return block_scan.from_q_steps(out), block_scan.from_lse_steps(lse)


def fixed_local_part(q, k, v, context, stride: int, allows, causal: bool = True):
  """Sub-block s of Q queries in block I sees the block's first (s + 1) * Q keys.

  One scan per s (over the blocks): (1 + stride / Q) / 2 keys per query instead of stride.
  Bidirectional: every query step sees its whole block, one scan (stride keys per query).
  """
  q_len = query_len(stride)
  per_block = stride // q_len
  num_blocks = q.shape[1] // stride
  kv = tuple(block_scan.heads_major(x) for x in (k, v))
  q_steps = block_scan.q_steps_of(q, q_len)                           # [blocks * per_block, ...]
  q_facts = tuple(block_scan.steps_of(a, q_len) for a in context[:2])
  if not causal:
    starts = (np.arange(num_blocks * per_block) // per_block * stride)[:, None]
    span = block_scan.Span(kv=0, facts=0, length=stride, allows=allows)
    out, lse = _scan_part([span], q_steps, q_facts, starts, (kv,), (tuple(context),))
    return block_scan.from_q_steps(out), block_scan.from_lse_steps(lse)
  pick = lambda x, s: x.reshape(num_blocks, per_block, *x.shape[1:])[:, s]
  starts = (np.arange(num_blocks) * stride)[:, None]
  parts = [_scan_part([block_scan.Span(kv=0, facts=0, length=(s + 1) * q_len, allows=allows)],
                      pick(q_steps, s), tuple(pick(a, s) for a in q_facts), starts, (kv,),
                      (tuple(context),))
           for s in range(per_block)]
  # [per_block][blocks, ...] -> [blocks * per_block, ...] in query order.
  interleave = lambda xs: jnp.stack(xs, axis=1).reshape(-1, *xs[0].shape[1:])
  out = interleave([o for o, _ in parts])
  lse = interleave([l for _, l in parts])
  return block_scan.from_q_steps(out), block_scan.from_lse_steps(lse)


def fixed_summary_part(q, k, v, context, stride: int, summary_len: int, allows,
                       own_block: bool, groups: int = SUMMARY_GROUPS, causal: bool = True):
  """Every query sees the last `summary_len` slots of the blocks up to its own.

  The summary keys are gathered once (`[b, blocks * c]`); the blocks are cut
  into `groups` runs, and the queries of a run see the summary prefix up to
  the run's last block (its own block too if `own_block`), so the keys
  after a query are computed only within its run. Bidirectional: every query
  sees every block's summary keys (one run; `allows` drops the query's own
  block when the local part has it).
  """
  q_len = query_len(stride)
  per_block = stride // q_len
  num_blocks = q.shape[1] // stride
  last = lambda x: block_sparse.from_blocks(
      block_sparse.to_blocks(x, stride)[:, :, stride - summary_len:])
  kv = tuple(block_scan.heads_major(last(x)) for x in (k, v))
  facts = tuple(last(a) for a in context)
  q_steps = block_scan.q_steps_of(q, q_len)
  q_facts = tuple(block_scan.steps_of(a, q_len) for a in context[:2])
  run = -(-num_blocks // groups) if causal else num_blocks
  outs, lses = [], []
  for first in range(0, num_blocks, run):
    end = min(first + run, num_blocks)
    steps = slice(first * per_block, end * per_block)
    if causal:
      length = summary_len * (end if own_block else end - 1)
    else:
      length = summary_len * num_blocks
    if length == 0:
      outs.append(jnp.zeros_like(q_steps[steps]))
      lses.append(jnp.full(q_steps[steps].shape[:-1], -jnp.inf, jnp.float32))
      continue
    span = block_scan.Span(kv=0, facts=0, length=length, allows=allows)
    out, lse = _scan_part([span], q_steps[steps], tuple(a[steps] for a in q_facts),
                          np.zeros(((end - first) * per_block, 1)), (kv,), (facts,))
    outs.append(out)
    lses.append(lse)
  out, lse = jnp.concatenate(outs), jnp.concatenate(lses)
  return block_scan.from_q_steps(out), block_scan.from_lse_steps(lse)


def strided_summary_part(q, k, v, context, stride: int, allows):
  """Query (I, a) sees slot a of every block J (n / stride keys): per head and column a, a
  small dense attention of the column's queries over its keys, materialised (`[b, h, stride,
  blocks, blocks]` scores, n * n / stride in all). Returns `(out, lse)` as the other parts."""
  b, padded, h, d = q.shape
  num_blocks = padded // stride
  columns = lambda x: jnp.transpose(x.reshape(b, num_blocks, stride, h, d), (0, 3, 2, 1, 4))
  rel, seg, valid = (jnp.swapaxes(block_sparse.to_blocks(a, stride), 1, 2) for a in context)
  mask = (block_sparse.document_mask(seg[..., :, None], seg[..., None, :], valid[..., None, :])
          & allows(rel[..., :, None], rel[..., None, :]))                 # [b, a, I, J]
  logits = jnp.einsum('bhaid,bhajd->bhaij', columns(q), columns(k))
  weights, lse = partial_softmax.softmax_part(logits, mask[:, None])
  out = jnp.einsum('bhaij,bhajd->bhaid', weights.astype(v.dtype), columns(v))
  return (jnp.transpose(out, (0, 3, 2, 1, 4)).reshape(b, padded, h, d),
          jnp.transpose(lse, (0, 3, 2, 1)).reshape(b, padded, h))


def component_part(component: str, q, k, v, context, stride: int, summary_len: int, allows,
                   earlier, causal: bool = True):
  """`(out [b, padded, h, d], lse [b, padded, h])` over every key the component can allow."""
  if component == 'strided_local':
    return strided_local_part(q, k, v, context, stride, allows, causal)
  if component == 'fixed_local':
    return fixed_local_part(q, k, v, context, stride, allows, causal)
  if component == 'strided_summary':
    return strided_summary_part(q, k, v, context, stride, allows)
  return fixed_summary_part(q, k, v, context, stride, summary_len, allows,
                            own_block='fixed_local' not in earlier, causal=causal)


def union_output(components, q, k, v, context, stride: int, summary_len: int,
                 causal: bool = True) -> jax.Array:
  """One softmax over the union of `components`: each later part drops earlier parts' keys,
  and the parts merge exactly through their log-sum-exps.

  Args:
    q, k, v: `[batch, padded, heads, head_dim]`, padded to whole blocks of `stride`.
    causal: the rules of the module docstring (False: bidirectional).
  Returns:
    `[batch, padded, heads, head_dim]`.
  """
  outs, lses = [], []
  for index, component in enumerate(components):
    earlier = components[:index]

    def allows(q_rel, k_rel, component=component, earlier=earlier):
      allowed = component_allows(component, q_rel, k_rel, stride, summary_len, causal)
      for other in earlier:
        allowed &= ~component_allows(other, q_rel, k_rel, stride, summary_len, causal)
      return allowed
    out, lse = component_part(component, q, k, v, context, stride, summary_len, allows, earlier,
                              causal)
    outs.append(out)
    lses.append(lse)
  return partial_softmax.merge_parts(outs, lses).astype(v.dtype)


def sparse_transformer_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                                 segment_ids: jax.Array, valid: jax.Array, *, pattern: str,
                                 stride: int, summary_len: int = 1,
                                 integration: str = 'merged', causal: bool = True) -> jax.Array:
  """Blocked factorized attention, scanned over query blocks.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
    pattern: one of PATTERNS; integration: 'merged' or 'multihead' (unions only).
    causal: the causal rules (module docstring); False: the bidirectional ones.
  Returns:
    `[batch, n, heads, head_dim]`.
  """
  n = q.shape[1]
  context = block_sparse.blocked_context(positions, segment_ids, valid, stride)
  padded = context.rel.shape[1]
  q, k, v = (block_sparse.pad_length(a, padded) for a in (q, k, v))
  components = UNIONS.get(pattern, (pattern,))
  if integration == 'multihead' and len(components) == 2:
    split = q.shape[2] // 2
    heads = (slice(0, split), slice(split, None))
    out = jnp.concatenate(
        [union_output((component,), q[:, :, h], k[:, :, h], v[:, :, h], context, stride,
                      summary_len, causal)
         for component, h in zip(components, heads)], axis=-2)
  else:
    out = union_output(components, q, k, v, context, stride, summary_len, causal)
  return out[:, :n]


class SparseTransformerAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`.

  Fields: `config` (`SparseTransformerConfig`, the layer's `model.sparse_transformer`), `shared`
  (`SharedSettings`: heads, `attention_backend`, `causal`), `dtype`.
  """
  Config = SparseTransformerConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: SparseTransformerConfig = SparseTransformerConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def kernel_pattern(model, section) -> backends.KernelPattern:
    """What a layer with these settings asks of a kernel (config checks)."""
    return sparse_splash.kernel_pattern(model, section)

  @staticmethod
  def init_state(config: SparseTransformerConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    q, k, v = projections.chunk_rotary_qkv(x, ctx, shared.num_heads, shared.head_dim, self.dtype)
    backend = backends.resolve_backend(
        shared.attention_backend, sparse_splash.kernel_pattern(shared, config),
        dtype=jnp.dtype(self.dtype).name, head_dim=shared.head_dim)
    if backend in ('splash', 'pallas_gpu'):   # positions consecutive along the chunk
      out = sparse_splash.sparse_transformer_splash(
          q, k, v, ctx.segment_ids, ctx.valid, pattern=config.pattern, stride=config.stride,
          summary_len=config.summary_len, integration=config.integration,
          causal=shared.causal, kernel=masked_kernel(backend)).astype(self.dtype)
    else:
      out = sparse_transformer_attention(q, k, v, ctx.positions, ctx.segment_ids, ctx.valid,
                                         pattern=config.pattern, stride=config.stride,
                                         summary_len=config.summary_len,
                                         integration=config.integration, causal=shared.causal)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}

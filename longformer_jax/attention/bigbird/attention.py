"""BigBird block-sparse attention (Zaheer et al., 2020): window + global + random blocks.

Within the chunk (stateless), rotary positions as in attention/vanilla/attention.py. The chunk is
cut into blocks of `b` slots (block_sparse.py); with blk(t) = t // b on
positions relative to the chunk's first token, query i may attend to key j
(same document, real key, and j <= i when causal) iff

  window   |blk(i) - blk(j)| <= w                       (w blocks on each side)
  random   blk(j) in R[blk(i)]                          (r random blocks per query block)
  global   i or j is a global token                     (attends to / is attended by all)

Global tokens (section 2, "BigBird-ITC"): every token of the first g blocks,
plus tokens flagged in `ctx.global_flags` (e.g. [CLS] or a question), at most
`max_global_tokens` of them, the earliest first; padded tokens are never
global. Bidirectional in an encoder model (models/encoder.py); a decoder LM
with the shared `model.causal = True` applies the causal rule to the same
block pattern and draws random blocks among past blocks only.

Settings: `config.model.bigbird` (`BigBirdConfig`). The random pattern R
`[num_blocks, r]` is drawn from an explicit key, `fold_in(PRNGKey(seed),
layer_index)` (`layer_index` is the layer's number, set by
`models/layer_schedule.layer_config`; 0 outside a stack and under
`scan_layers`), by `random_block_pattern`: it depends only on (key, number of
blocks), so train and eval see the same pattern for the same key and chunk
length. A chunk length with another number of blocks draws another pattern,
so `BigBirdConfig.validate` refuses random blocks when the model would see
several such lengths (phases, an evaluation chunk length). It is the same for
every row and every chunk. Each query block draws r distinct blocks
outside its window and the ITC blocks (and, causal, in the past); when fewer
than r such blocks exist, the rest of its draws repeat window or global
blocks, whose keys the random set then masks.

Blocked implementation, O(n * (2w + 1 + r) * b + n * G) for G global slots:
a scan over the query blocks (block_scan.py), one block of b queries per
step, one softmax over its disjoint key spans: the window blocks (one slice
of the keys padded by w blocks on each side, front only when causal), the r
random blocks (slices at R[I]; window keys and global keys masked, they are
in the other spans) and the G gathered global tokens (window keys masked).
One step's `[batch, heads, b, (2w + 1 + r) * b + G]` scores stay in cache
and the backward pass recomputes them. The G global queries then attend to
the whole chunk, O(n * G), materialised (`[batch, heads, G, n]`), and their
rows replace the sparse ones.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core.block_sparse_flash import masked_kernel
from longformer_jax.attention.core import block_scan, block_sparse, projections
from longformer_jax.attention.bigbird import splash as bigbird_splash
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.section import Section


@dataclasses.dataclass(frozen=True)
class BigBirdConfig(Section):
  """`config.model.bigbird`; causal or bidirectional is the shared `model.causal`."""
  block: int = 16                 # b: tokens per block (the chunk is padded to whole blocks)
  window_blocks: int = 1          # w: blocks on each side of the query's own block
  random_blocks: int = 2          # r: random key blocks per query block
  global_blocks: int = 1          # g: the chunk's first g blocks are global (ITC)
  max_global_tokens: int = 0      # most tokens flagged in ctx.global_flags made global
  seed: int = 0                   # random blocks of layer i: fold_in(PRNGKey(seed), i)

  def validate(self, env) -> None:
    self.require(self.block >= 1, 'block', 'must be >= 1')
    for name in ('window_blocks', 'random_blocks', 'global_blocks', 'max_global_tokens'):
      self.require(getattr(self, name) >= 0, name, 'must be >= 0')
    if env is not None and self.random_blocks:
      lengths = sorted(set(env.chunk_lens))
      blocks = sorted({block_sparse.num_blocks_for(n, self.block) for n in lengths})
      self.require(len(blocks) <= 1, 'random_blocks',
                   f'random blocks per query block: the random pattern depends on the chunk '
                   f'length, and the chunk lengths the model sees ({_join(lengths)}: training '
                   f'phases, evaluation) give {_join(blocks)} blocks of {self.block}, so it '
                   f'differs between them; use lengths with one number of blocks or '
                   f'random_blocks=0')


def _join(values) -> str:
  return ', '.join(str(v) for v in values)


def random_block_pattern(key: jax.Array, num_blocks: int, num_random: int, window_blocks: int,
                         global_blocks: int, causal: bool) -> jax.Array:
  """R: `[num_blocks, min(num_random, num_blocks)]` int32, distinct key blocks per query block.

  Candidates for query block I are the blocks J with |I - J| > window_blocks,
  J >= global_blocks and (causal) J < I; they are drawn first, uniformly
  without replacement; non-candidates fill any remaining draws.
  """
  query, key_block = jnp.arange(num_blocks)[:, None], jnp.arange(num_blocks)[None, :]
  candidate = (jnp.abs(query - key_block) > window_blocks) & (key_block >= global_blocks)
  if causal:
    candidate &= key_block < query
  scores = jax.random.uniform(key, (num_blocks, num_blocks))
  scores = jnp.where(candidate, scores, scores - 2.0)
  _, index = jax.lax.top_k(scores, min(num_random, num_blocks))
  return index.astype(jnp.int32)


def pattern_key(seed: int, layer_index: int) -> jax.Array:
  """The explicit PRNG key of a layer's random blocks."""
  return jax.random.fold_in(jax.random.PRNGKey(seed), layer_index)


def effective_global_flags(rel: jax.Array, valid: jax.Array, flags: jax.Array, block: int,
                           global_blocks: int, max_global_tokens: int) -> jax.Array:
  """`[batch, n]`: the ITC blocks plus the first `max_global_tokens` flagged tokens, if real."""
  itc = rel // block < global_blocks
  flagged = flags & valid & ~itc
  flagged &= jnp.cumsum(flagged, axis=1) <= max_global_tokens
  return (itc | flagged) & valid


def take_slots(x: jax.Array, index: jax.Array) -> jax.Array:
  """`x [batch, n, ...]` at `index [batch, m]` -> `[batch, m, ...]`."""
  return jax.vmap(lambda row, i: row[i])(x, index)


def bigbird_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                      segment_ids: jax.Array, valid: jax.Array, global_flags, random_blocks,
                      *, block: int, window_blocks: int, global_blocks: int,
                      max_global_tokens: int, causal: bool) -> jax.Array:
  """Blocked BigBird attention.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
    global_flags: `[batch, n]` bool or None.
    random_blocks: R `[num_blocks, r]` int32 (random_block_pattern), num_blocks = ceil(n / block).
  Returns:
    `[batch, n, heads, head_dim]`.
  """
  n = q.shape[1]
  context = block_sparse.blocked_context(positions, segment_ids, valid, block)
  padded = context.rel.shape[1]
  q, k, v = (block_sparse.pad_length(a, padded) for a in (q, k, v))
  flags = jnp.zeros_like(context.valid) if global_flags is None else global_flags
  is_global = effective_global_flags(context.rel, context.valid,
                                     block_sparse.pad_length(flags, padded, False), block,
                                     global_blocks, max_global_tokens)

  def in_window(q_rel, k_rel):
    return jnp.abs(q_rel // block - k_rel // block) <= window_blocks

  def causal_rule(q_rel, k_rel):
    if causal:
      return k_rel <= q_rel
    return jnp.ones(jnp.broadcast_shapes(q_rel.shape, k_rel.shape), bool)

  outside_window = lambda q_rel, k_rel: ~in_window(q_rel, k_rel) & causal_rule(q_rel, k_rel)
  num_blocks = padded // block
  # Keys heads-major, padded by the window on both sides (front only, causal), so that
  # the window of query block I is the slice [I * block, (I + span) * block).
  front, back = window_blocks * block, 0 if causal else window_blocks * block
  pad_keys = lambda x: jnp.pad(block_scan.heads_major(x), ((0, 0), (0, 0), (front, back), (0, 0)))
  pad_facts = lambda x, value: jnp.pad(x, ((0, 0), (front, back)), constant_values=value)
  kvs = [(pad_keys(k), pad_keys(v))]
  padded_facts = (pad_facts(context.rel, -1), pad_facts(context.segments, -1))
  facts = [padded_facts + (pad_facts(context.valid, False),),
           # Random blocks: global keys are in the global span.
           padded_facts + (pad_facts(context.valid & ~is_global, False),)]
  window_len = (window_blocks + (1 if causal else window_blocks + 1)) * block
  spans = [block_scan.Span(kv=0, facts=0, length=window_len,
                           allows=lambda q_rel, k_rel: in_window(q_rel, k_rel)
                           & causal_rule(q_rel, k_rel))]
  starts = [jnp.arange(num_blocks, dtype=jnp.int32) * block]
  for r in range(random_blocks.shape[1]):
    spans.append(block_scan.Span(kv=0, facts=1, length=block, allows=outside_window))
    starts.append(random_blocks[:, r].astype(jnp.int32) * block + front)

  num_globals = min(global_blocks * block + max_global_tokens, padded)
  if num_globals:
    slot = jnp.arange(padded)
    # Global slots first (earliest first), then the earliest others, which are masked.
    _, global_index = jax.lax.top_k(jnp.where(is_global, padded - slot, -slot), num_globals)
    global_flag = take_slots(is_global, global_index)
    g_rel, g_seg, g_valid = (take_slots(a, global_index) for a in context)
    kvs.append(tuple(block_scan.heads_major(take_slots(x, global_index)) for x in (k, v)))
    facts.append((g_rel, g_seg, g_valid & global_flag))
    spans.append(block_scan.Span(kv=1, facts=2, length=num_globals, allows=outside_window))
    starts.append(jnp.zeros((num_blocks,), jnp.int32))
  out, _ = block_scan.span_attention(
      block_scan.ScanGeometry(tuple(spans)), block_scan.q_steps_of(q, block),
      tuple(block_scan.steps_of(a, block) for a in context[:2]), jnp.stack(starts, axis=1),
      tuple(kvs), tuple(facts))
  out = block_scan.from_q_steps(out)

  if num_globals:
    # Global queries attend to the whole chunk: [batch, G] x [batch, padded].
    logits = jnp.einsum('bghd,bkhd->bhgk', take_slots(q, global_index), k)
    mask = (block_sparse.document_mask(g_seg[:, :, None], context.segments[:, None, :],
                                       context.valid[:, None, :])
            & causal_rule(g_rel[:, :, None], context.rel[:, None, :]))
    global_out = attend(logits, mask, v)
    rows = jnp.arange(q.shape[0])[:, None]
    sparse_rows = out[rows, global_index]
    out = out.at[rows, global_index].set(
        jnp.where(global_flag[..., None, None], global_out, sparse_rows))
  return out[:, :n]


class BigBirdAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`.

  Fields: `config` (`BigBirdConfig`, the layer's `model.bigbird`), `shared` (`SharedSettings`:
  heads, `causal`, `attention_backend`), `layer_index`, `dtype`.
  """
  Config = BigBirdConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: BigBirdConfig = BigBirdConfig()
  # Not a setting: the layer's number, which seeds its random blocks; the stack writes it
  # into each layer's config (layer_schedule.layer_config; 0 where it does not, scan_layers)
  # and `attention_layer` passes it on.
  layer_index: int = 0
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def kernel_pattern(model, section) -> backends.KernelPattern:
    """What a layer with these settings asks of a kernel (config checks)."""
    return bigbird_splash.kernel_pattern(model, section)

  @staticmethod
  def init_state(config: BigBirdConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  def pattern(self, chunk_len: int) -> jax.Array:
    """This layer's random blocks R for a chunk of `chunk_len` tokens."""
    config = self.config
    return random_block_pattern(pattern_key(config.seed, self.layer_index),
                                block_sparse.num_blocks_for(chunk_len, config.block),
                                config.random_blocks, config.window_blocks, config.global_blocks,
                                self.shared.causal)

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    q, k, v = projections.chunk_rotary_qkv(x, ctx, shared.num_heads, shared.head_dim, self.dtype)
    backend = backends.resolve_backend(
        shared.attention_backend, bigbird_splash.kernel_pattern(shared, config),
        dtype=jnp.dtype(self.dtype).name, head_dim=shared.head_dim)
    if backend in ('splash', 'pallas_gpu'):   # static R, no flagged globals (bigbird/splash.py)
      out = bigbird_splash.bigbird_splash(
          q, k, v, ctx.segment_ids, ctx.valid,
          bigbird_splash.static_random_blocks(self.pattern, x.shape[1]), block=config.block,
          window_blocks=config.window_blocks, global_blocks=config.global_blocks,
          causal=shared.causal, kernel=masked_kernel(backend)).astype(self.dtype)
    else:
      out = bigbird_attention(q, k, v, ctx.positions, ctx.segment_ids, ctx.valid,
                              ctx.global_flags, self.pattern(x.shape[1]), block=config.block,
                              window_blocks=config.window_blocks,
                              global_blocks=config.global_blocks,
                              max_global_tokens=config.max_global_tokens, causal=shared.causal)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}

"""Longformer attention (Beltagy et al., 2020): sliding window, dilation, global tokens.

Every path costs O(n·w) (plus O(n·g) for g global tokens); no n x n array is
ever built.

Window convention: `model.longformer.window` is ONE-SIDED (the original
code's `attention_window`; Hugging Face's `attention_window` is twice this):
with dilation d a query at position i attends to keys at i - j in
{0, d, ..., w·d} (causal: w + 1 keys) or |i - j| in {0, d, ..., w·d}
(two-sided: 2w + 1 keys).

Settings: `config.model.longformer` (`LongformerConfig`); causal (decoder) or
two-sided (encoder) is the shared `model.causal`. Per-layer windows and
dilations come from `model.layer_schedule.longformer` (the model builds
layer i from its own config), so this module reads one value of each.

Positions: RoPE (as attention/vanilla/attention.py), rotated relative to the chunk's
first position; the cache holds hidden states (keys are re-made and rotated at
their stored positions), which keeps it exact. The cache is stop-gradient.

Kernels (`model.attention_backend`, attention/core/attention_backend.py): the
sliding window without global tokens and without a window cache (two-sided
layers, or `window_cache=False`) runs through the splash kernel on TPU: a
`LocalMask` of the window for heads of dilation 1, a `DilatedWindow` rule per
dilated head (splash_kernels.py), documents and padding as segment ids. On a
GPU in bfloat16 the causal window of dilation 1 runs through cuDNN's sliding
window (core/cudnn_window.py): documents and padding as packed segments, the
window cache as extra slots, global tokens merged by log-sum-exp. Everything
else stays on the blocked XLA kernel (docs/kernels.md). On a mesh with a `sequence` axis > 1 the
same window (no cache or dilation; a window within one device's share of the
chunk) is computed with the chunk split along its length, each device taking a
halo of `window` tokens from its neighbours
(attention/sequence_parallel/window_attention.py); global tokens are then gathered and
their rows merged across the devices (attention/sequence_parallel/global_attention.py;
docs/scaling.md).
"""

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import cudnn_window, global_tokens, projections
from longformer_jax.attention.longformer.cudnn_two_sided_window import two_sided_window_attention
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.longformer.dilated_window import dilated_window_attention
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.core.partial_softmax import merge_parts, softmax_part
from longformer_jax.attention.core.sliding_window import auto_block_size
from longformer_jax.attention.core.block_sparse_flash import masked_kernel
from longformer_jax.attention.core.splash_kernels import dilated_window_rules
from longformer_jax.config.section import Section
from longformer_jax.layers.linear import projection
from longformer_jax.layers.positional import apply_rotary
from longformer_jax.memory import fifo
from longformer_jax.parallel import sequence_settings
from longformer_jax.attention.sequence_parallel import global_attention, window_attention
from longformer_jax.attention.shared_settings import SharedSettings

KERNEL_AXES = ('embed', 'heads', 'head_dim')


def parse_dilation_list(spec: str) -> tuple[int, ...]:
  """'1,1,2,2', '1:1:2:2' or '1 1 2 2' -> (1, 1, 2, 2); '' -> (); ValueError if not integers."""
  return tuple(int(p) for p in re.split(r'[,:\s]+', spec.strip()) if p)


@dataclasses.dataclass(frozen=True)
class LongformerConfig(Section):
  """`config.model.longformer`; causal or two-sided is the shared `model.causal`."""
  window: int = 256               # ONE-SIDED window w: w + 1 keys causal, 2w + 1 two-sided
                                  # (Hugging Face's attention_window is 2w)
  dilation: int = 1               # d of every head: keys at distances 0, d, ..., w·d
  head_dilations: str = ''        # one d per head, e.g. '1,1,2,2' (',', ':' or spaces);
                                  # '' = `dilation` for every head
  block_size: int = 0             # queries per block of the blocked kernel (0: automatic)
  global_tokens: int = 0          # most global tokens per row and chunk (0: no global
                                  # attention; task training sets the task's number)
  global_projections: bool = True  # separate Q_g, K_g, V_g for global rows (paper, sec. 3.1)
  window_cache: bool = True       # causal layers: cache the last w·max(d) hidden states so
                                  # windows cross chunk boundaries (two-sided: never)
  rotary: bool = True             # RoPE on queries and keys (False: the model adds positions)

  def validate(self, env) -> None:
    self.require(self.window >= 1, 'window', 'must be >= 1 (one-sided: keys on each side)')
    self.require(self.dilation >= 1, 'dilation', 'must be >= 1')
    try:
      dilations = parse_dilation_list(self.head_dilations)
    except ValueError:
      dilations = None
    self.require(dilations is not None, 'head_dilations',
                 "must be integers separated by ',', ':' or spaces")
    self.require(all(d >= 1 for d in dilations), 'head_dilations', 'must all be >= 1')
    self.require(not dilations or self.dilation == 1, 'dilation',
                 'is ignored: head_dilations sets every head\'s dilation; set only one of them')
    if env is not None:
      num_heads = env.model.num_heads
      self.require(not dilations or len(dilations) == num_heads, 'head_dilations',
                   f'needs one dilation per head (model.num_heads={num_heads}), '
                   f'got {len(dilations)}')
    self.require(self.block_size >= 0, 'block_size', 'must be >= 0 (0: automatic)')
    self.require(self.global_tokens >= 0, 'global_tokens', 'must be >= 0 (0: none)')


def dilations_per_head(section, num_heads: int) -> tuple[int, ...]:
  """Each head's dilation: `head_dilations` if set, else `dilation` for every head."""
  return parse_dilation_list(section.head_dilations) or (section.dilation,) * num_heads


class LongformerAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  Fields: `config` (`LongformerConfig`, this layer's `model.longformer`), `shared`
  (`SharedSettings`: heads, `causal`, `attention_backend`, and `heads.qkv_bias`/`out_bias` on
  Q, K, V (and Q_g, K_g, V_g) and the output for imported checkpoints), `dtype`.
  """
  Config = LongformerConfig
  reads_mem_len = False           # its cache length follows the window, not model.mem_len

  shared: SharedSettings
  config: LongformerConfig = LongformerConfig()
  dtype: jnp.dtype = jnp.float32

  @property
  def head_dilations(self) -> tuple[int, ...]:
    """`[num_heads]` dilations: `config.head_dilations` parsed, else `config.dilation` each."""
    return dilations_per_head(self.config, self.shared.num_heads)

  @property
  def uses_window_cache(self) -> bool:
    """Whether the layer caches past hidden states: `config.window_cache` on causal layers
    (two-sided layers never do)."""
    return self.config.window_cache and self.shared.causal

  @property
  def rotary(self) -> bool:
    """RoPE on queries and keys: `config.rotary` unless the model's positions are not rotary
    (learned absolute positions of imported RoBERTa-based checkpoints replace RoPE)."""
    return self.config.rotary and self.shared.heads.rotary

  @staticmethod
  def kernel_pattern(model, section) -> backends.KernelPattern:
    """What a layer with shared settings `model` and `section` asks of a kernel (config checks)."""
    return _pattern(section.window, dilations_per_head(section, model.num_heads), model.causal,
                    section.global_tokens, in_chunk=not (section.window_cache and model.causal))

  @staticmethod
  def init_state(config: LongformerConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """A FIFO cache of the last `window * max(dilation)` hidden states,
    `[batch_size, capacity, d_model]` (capacity 0 without cache)."""
    capacity = cache_length(config.window, dilations_per_head(config, shared.num_heads),
                            config.window_cache and shared.causal)
    return fifo.create(batch_size, capacity, (shared.d_model,), dtype)

  def _rotate(self, x: jax.Array, positions: jax.Array, origin: jax.Array) -> jax.Array:
    return apply_rotary(x, positions - origin) if self.rotary else x

  def _window_part(self, q, k, v, ctx: AttentionContext, context: fifo.FifoMemory,
                   key_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sliding-window attention, heads grouped by dilation -> `(out, lse)`."""
    key_offset = context.positions.shape[1] - ctx.positions.shape[1]
    block_size = self.config.block_size or auto_block_size(self.config.window)
    outs, lses, order = [], [], []
    for dilation in sorted(set(self.head_dilations)):
      heads = [h for h, d in enumerate(self.head_dilations) if d == dilation]
      everyone = len(heads) == self.shared.num_heads
      pick = (lambda a: a) if everyone else (lambda a: a[:, :, heads])
      out, lse = dilated_window_attention(
          pick(q), pick(k), pick(v), ctx.positions, ctx.segment_ids, context.positions,
          context.segment_ids, key_valid, window=self.config.window, dilation=dilation,
          block_size=block_size, causal=self.shared.causal, key_offset=key_offset,
          scale=self.shared.head_dim ** -0.5)
      outs.append(out)
      lses.append(lse)
      order += heads
    if len(outs) == 1:
      return outs[0], lses[0]
    inverse = [order.index(h) for h in range(self.shared.num_heads)]
    return (jnp.concatenate(outs, axis=2)[:, :, inverse],
            jnp.concatenate(lses, axis=2)[:, :, inverse])

  def _cudnn_window_part(self, q, k, v, context: fifo.FifoMemory, key_valid: jax.Array,
                         key_offset: int) -> tuple[jax.Array, jax.Array]:
    """The window through cuDNN over the `[cache; chunk]` slots -> `(out, lse)`.

    The cache slots join the sequence as slots whose queries are zeros and
    whose rows are dropped, so cuDNN's causal window over slots is the window
    over positions (core/cudnn_window.py); a two-sided window (no cache) is a
    left and a right causal pass merged (attention/longformer/cudnn_two_sided_window.py).
    Inputs it cannot pack run the blocked XLA kernel instead. The causal
    log-sum-exp (with its gradient) is made only when global tokens are merged in.
    """
    scale = self.shared.head_dim ** -0.5
    block_size = self.config.block_size or auto_block_size(self.config.window)
    pad_front = lambda a: jnp.pad(a, ((0, 0), (key_offset, 0)) + ((0, 0),) * (a.ndim - 2))

    def fallback(q_slots, k_, v_):
      out, lse = dilated_window_attention(
          q_slots[:, key_offset:], k_, v_, context.positions[:, key_offset:],
          context.segment_ids[:, key_offset:], context.positions, context.segment_ids,
          key_valid, window=self.config.window, dilation=1, block_size=block_size,
          causal=self.shared.causal, key_offset=key_offset, scale=scale)
      return pad_front(out), jnp.pad(lse, ((0, 0), (key_offset, 0), (0, 0)),
                                     constant_values=-jnp.inf)

    if not self.shared.causal:     # two-sided layers keep no cache: key_offset is 0
      return two_sided_window_attention(q, k, v, context.positions, context.segment_ids,
                                        key_valid, window=self.config.window, scale=scale,
                                        fallback=fallback)
    with_lse = bool(self.config.global_tokens)
    result = cudnn_window.window_attention(
        pad_front(q), k, v, context.positions, context.segment_ids, key_valid,
        window=self.config.window, scale=scale, fallback=fallback, with_lse=with_lse)
    out, lse = result if with_lse else (result, None)
    return out[:, key_offset:], None if lse is None else lse[:, key_offset:]

  @nn.compact
  def __call__(self, x: jax.Array, state: fifo.FifoMemory, ctx: AttentionContext):
    context, new_state = projections.memory_and_chunk(state, x, ctx)
    chunk_len = x.shape[1]
    key_offset = context.positions.shape[1] - chunk_len
    shared = self.shared
    make = lambda name: projection((shared.num_heads, shared.head_dim), kernel_axes=KERNEL_AXES,
                                   name=name, dtype=self.dtype, use_bias=shared.heads.qkv_bias,
                                   bias_axes=KERNEL_AXES[1:])
    query, key, value = make('query'), make('key'), make('value')
    origin = ctx.positions[:, :1]
    q = self._rotate(query(x), ctx.positions, origin)
    k = self._rotate(key(context.values), context.positions, origin)
    v = value(context.values)

    aux = {}
    key_valid = context.valid
    if self.config.global_tokens:
      flags = (jnp.zeros_like(ctx.valid) if ctx.global_flags is None
               else ctx.global_flags & ctx.valid)
      slots, found = global_tokens.first_global_slots(flags, self.config.global_tokens)
      aux['global_tokens_dropped'] = jnp.mean(
          jnp.sum(flags, axis=1) - jnp.sum(found, axis=1)).astype(jnp.float32)
      is_global = global_tokens.global_key_flags(slots, chunk_len)
      # Global keys are attended through the global part only (counted once).
      key_valid = key_valid & ~jnp.pad(is_global, ((0, 0), (key_offset, 0)))

    backend = backends.resolve_backend(
        self.shared.attention_backend,
        _pattern(self.config.window, self.head_dilations, self.shared.causal,
                 self.config.global_tokens, in_chunk=key_offset == 0),
        dtype=jnp.dtype(self.dtype).name, head_dim=self.shared.head_dim)
    split = self._splits_over_sequence(chunk_len, key_offset)
    if split and self.config.global_tokens:
      # The chunk split over the sequence axis: window halos, gathered global keys, global
      # rows merged across devices (sequence_parallel/global_attention.py; docs/scaling.md).
      projected = self._global_projections(x, context, ctx, slots, origin, (query, key, value))
      q_g, k_g, v_g = projected if projected else (None, None, None)
      out = global_attention.sequence_parallel_global_attention(
          q, k, v, ctx.positions, ctx.segment_ids, ctx.valid, slots, found,
          mesh=jax.sharding.get_abstract_mesh(), window=self.config.window,
          causal=self.shared.causal, scale=self.shared.head_dim ** -0.5,
          block_size=self.config.block_size or None, global_queries=q_g, global_keys=k_g,
          global_values=v_g)
    elif split:
      # The chunk split along its length over the mesh's sequence axis, a halo of `window`
      # tokens from each neighbour (sequence_parallel/window_attention.py; docs/scaling.md).
      out = window_attention.sequence_parallel_window_attention(
          q, k, v, ctx.positions, ctx.segment_ids, key_valid,
          mesh=jax.sharding.get_abstract_mesh(), window=self.config.window,
          causal=self.shared.causal, scale=self.shared.head_dim ** -0.5,
          block_size=self.config.block_size or None)
    elif backend == 'cudnn':       # dilation 1; cache and global tokens allowed
      out, lse = self._cudnn_window_part(q, k, v, context, key_valid, key_offset)
    elif backend in ('splash', 'pallas_gpu'):   # no cache or global tokens; per-head dilation
      out = masked_kernel(backend)(q * jnp.asarray(self.shared.head_dim ** -0.5, q.dtype), k, v,
                                   ctx.segment_ids, key_valid,
                                   mask=dilated_window_rules(self.config.window,
                                                             self.head_dilations,
                                                             self.shared.causal))
    else:
      out, lse = self._window_part(q, k, v, ctx, context, key_valid)
    if self.config.global_tokens and not split:
      to_global, to_global_lse = self._attend_global_keys(q, k, v, ctx, slots, found, key_offset)
      out = merge_parts([out, to_global], [lse, to_global_lse])
      rows = self._global_rows(x, q, k, v, context, ctx, slots, found, origin,
                               (query, key, value))
      out = global_tokens.scatter_slots(out, slots, rows.astype(out.dtype))
    out = out.astype(self.dtype)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return (projections.project_output(out, self.shared.d_model, self.dtype,
                                       self.shared.heads.out_bias),
            new_state, aux)

  def _splits_over_sequence(self, chunk_len: int, key_offset: int) -> bool:
    """Whether the window (and global tokens) are computed with the chunk split over a
    sequence axis > 1: no cache, no dilation, and a window within one device's shard."""
    n = sequence_settings.sequence_axis_size()
    return (n > 1 and key_offset == 0 and set(self.head_dilations) == {1}
            and self.config.window <= chunk_len // n)

  def _attend_global_keys(self, q, k, v, ctx: AttentionContext, slots, found, key_offset):
    """Every query over the chunk's global tokens (local K_s, V_s) -> `(out, lse [b, c, h])`."""
    chunk_k, chunk_v = k[:, key_offset:], v[:, key_offset:]
    k_g, v_g = global_tokens.gather_slots(chunk_k, slots), global_tokens.gather_slots(chunk_v, slots)
    mask = causal_document_mask(ctx.positions, ctx.segment_ids,
                                global_tokens.gather_slots(ctx.positions, slots),
                                global_tokens.gather_slots(ctx.segment_ids, slots), found,
                                causal=self.shared.causal)                       # [b, c, g]
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k_g,
                        preferred_element_type=jnp.float32) * self.shared.head_dim ** -0.5
    weights, lse = softmax_part(logits, mask[:, None])
    out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v_g)
    return out, jnp.swapaxes(lse, 1, 2)

  def _global_projections(self, x, context: fifo.FifoMemory, ctx: AttentionContext, slots,
                          origin, local_projections):
    """`(Q_g [b, g, h, d] of the global tokens, K_g, V_g [b, mem + c, h, d])`, rotated;
    None without separate global projections."""
    if not self.config.global_projections:
      return None
    sources = [{name: nn.unbox(value) for name, value in p.variables['params'].items()}
               for p in local_projections]
    make = lambda name: global_tokens.InitialisedFromProjection(KERNEL_AXES, self.dtype,
                                                                name=name)
    q_g = make('query_global')(global_tokens.gather_slots(x, slots), **sources[0])
    k_g = make('key_global')(context.values, **sources[1])
    v_g = make('value_global')(context.values, **sources[2])
    return (self._rotate(q_g, global_tokens.gather_slots(ctx.positions, slots), origin),
            self._rotate(k_g, context.positions, origin), v_g)

  def _global_rows(self, x, q, k, v, context: fifo.FifoMemory, ctx: AttentionContext,
                   slots, found, origin, local_projections):
    """The global tokens' rows: each attends to all of `[cache; chunk]` -> `[b, g, h, d]`."""
    g_positions = global_tokens.gather_slots(ctx.positions, slots)
    g_segments = global_tokens.gather_slots(ctx.segment_ids, slots)
    projected = self._global_projections(x, context, ctx, slots, origin, local_projections)
    q_g, k_g, v_g = projected or (global_tokens.gather_slots(q, slots), k, v)
    mask = causal_document_mask(g_positions, g_segments, context.positions, context.segment_ids,
                                context.valid, causal=self.shared.causal) & found[:, :, None]
    logits = jnp.einsum('bqhd,bkhd->bhqk', q_g, k_g,
                        preferred_element_type=jnp.float32) * self.shared.head_dim ** -0.5
    weights, _ = softmax_part(logits, mask[:, None])
    return jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v_g.dtype), v_g)


def cache_length(window: int, head_dilations: tuple, window_cache: bool) -> int:
  """Hidden states one layer needs from before the chunk: w * max(d), or 0."""
  return window * max(head_dilations) if window_cache else 0


def _pattern(window: int, head_dilations: tuple, causal: bool, num_global: int,
             in_chunk: bool) -> backends.KernelPattern:
  """The window `-w..0` (causal) or `-w..w`, O(n·w): cuDNN's causal sliding window with
  packed segments (core/cudnn_window.py; a cache and global tokens merged in; two-sided as
  two causal passes). Dilated heads are splash rules (`DilatedWindow`), which cuDNN cannot
  express."""
  dilated = any(d != 1 for d in head_dilations)
  return backends.KernelPattern(
      left=window * max(head_dilations, default=1),
      right=0 if causal else window * max(head_dilations, default=1),
      in_chunk=in_chunk, dense_mask_ok=False, cudnn_window=True,
      cudnn_only='global tokens' if num_global > 0 else '',
      splash_only='dilated windows' if dilated else '')

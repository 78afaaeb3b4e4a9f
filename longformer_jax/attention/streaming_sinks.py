"""StreamingLLM attention: attention sinks plus a rolling window (Xiao et al., 2023).

Every query attends to
- the `num_sinks` first tokens of its document (the "attention sinks"), and
- the `window` most recent tokens of its document, itself included,
exactly what a token-by-token StreamingLLM decoder with a KV cache of
`num_sinks + window` entries sees (settings: `config.model.streaming_sinks`,
`StreamingSinksConfig`). Both rules compare positions
(docs/design.md, contract 2): a key is a window key iff 0 <= p_q - p_k < w, and a
sink iff p_k - d_q < s, where d_q is the position of the query's document
start.

Positions inside the cache (section 3.2 of the paper): RoPE positions are the
entries' ranks in the cache, not their text positions. For a query whose
cache has dropped `gap` tokens between the sinks and the window,
  gap_q = max(0, (p_q - w + 1) - (d_q + s)),
a window key is at rotary distance p_q - p_k (the window is contiguous) and a
sink outside the window at distance p_q - gap_q - p_k. RoPE's score depends
only on that distance, so this is computed exactly with two query rotations
(at p_q and at p_q - gap_q), one score matrix each, picked per (query, key)
pair. `positions='original'` uses the text positions instead (gap 0),
for the paper's ablation.

State (all stop-gradient, pre-rotation keys and values):
- `window`: a FIFO of the `window - 1` most recent tokens
  (`values [batch, w - 1, heads, 2 * head_dim]`: keys then values per head);
- `sinks`: `[batch, num_sinks, heads, 2 * head_dim]`, slot o holds the token at
  offset o of the row's current (latest) document once it has arrived;
- `doc_start`, `last_segment`: `[batch]` int32, the current document's first
  position and segment id, so that a document starting in the middle of a
  chunk (no `reset` flag) gets its own sinks.

The query/key/value/out projections are vanilla's (same names and shapes),
so a model trained with `attention='vanilla'` runs with this layer at
evaluation time.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import cudnn_window, projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.sliding_window import auto_block_size, blocked_window_attention
from longformer_jax.config.section import Section
from longformer_jax.layers.capped_rotary import rotary_scores
from longformer_jax.memory import fifo

SINK_POSITION_MODES = ('cache', 'original')


@dataclasses.dataclass(frozen=True)
class StreamingSinksConfig(Section):
  """`config.model.streaming_sinks`: the sinks, the window and the cache positions."""
  num_sinks: int = 4          # first tokens of the document kept (the attention sinks)
  window: int = 256           # most recent tokens each query sees, itself included
  positions: str = 'cache'    # RoPE positions: cache (slots in the cache, the paper) | original

  def validate(self, env) -> None:
    del env
    self.require(self.num_sinks >= 0, 'num_sinks', 'must be >= 0')
    self.require(self.window >= 1, 'window', 'must be >= 1 (the query itself counts)')
    self.require(self.positions in SINK_POSITION_MODES, 'positions',
                 f'must be one of {SINK_POSITION_MODES}')


def document_starts(ctx: AttentionContext, doc_start: jax.Array,
                    last_segment: jax.Array) -> jax.Array:
  """`[batch, chunk]` position of each token's document start.

  A token starts a document when its segment id differs from the previous
  token's (the previous chunk's last one for the first token; none after a
  reset). Positions increase along the chunk, so a running max carries it.
  """
  previous = jnp.where(ctx.reset, -1, last_segment)[:, None]
  previous = jnp.concatenate([previous, ctx.segment_ids[:, :-1]], axis=1)
  starts = ctx.segment_ids != previous
  carried = jnp.where(ctx.reset, jnp.iinfo(jnp.int32).min, doc_start)[:, None]
  return jax.lax.cummax(jnp.where(starts, ctx.positions, carried), axis=1)


def updated_sinks(sinks: fifo.FifoMemory, chunk: fifo.FifoMemory, chunk_doc_start: jax.Array,
                  num_sinks: int) -> fifo.FifoMemory:
  """Slot o := the token at offset o of the chunk's last document (or kept / invalid).

  Args:
    sinks: the store before the chunk, `[batch, s, ...]`.
    chunk: the chunk's entries `[batch, chunk, ...]`.
    chunk_doc_start: `[batch, chunk]` document start of each token.
  """
  last_segment = chunk.segment_ids[:, -1]
  wanted = chunk_doc_start[:, -1:] + jnp.arange(num_sinks)[None, :]       # [b, s]
  match = ((chunk.positions[:, None, :] == wanted[:, :, None])
           & (chunk.segment_ids[:, None, :] == last_segment[:, None, None])
           & chunk.valid[:, None, :])                                     # [b, s, chunk]
  in_chunk = match.any(axis=-1)
  index = jnp.argmax(match, axis=-1)
  from_chunk = jax.tree_util.tree_map(
      lambda a: jnp.take_along_axis(a, index.reshape(index.shape + (1,) * (a.ndim - 2)), axis=1),
      chunk)
  keep_old = sinks.valid & (sinks.segment_ids == last_segment[:, None])
  pick = lambda new, old: jnp.where(in_chunk.reshape(in_chunk.shape + (1,) * (new.ndim - 2)),
                                    new, old.astype(new.dtype))
  merged = jax.tree_util.tree_map(pick, from_chunk, sinks)
  return merged.replace(valid=in_chunk | keep_old)


class StreamingSinkAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  Attributes:
    shared: the layer's shape, `attention_backend`, and how it projects its heads
      (`shared.heads`, imported checkpoints: attention/core/checkpoint_heads.py).
    config: `StreamingSinksConfig` (`positions`: the RoPE positions of out-of-window sinks).
  """
  Config = StreamingSinksConfig

  shared: SharedSettings
  config: StreamingSinksConfig = StreamingSinksConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def kernel_pattern(model, section) -> backends.KernelPattern:
    return _pattern(section.num_sinks, section.window)

  @staticmethod
  def init_state(config: StreamingSinksConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32) -> dict:
    """Empty sink store (`[batch_size, num_sinks, num_heads, 2 * head_dim]`: keys and values)
    and window (`[batch_size, window - 1, ...]`); no current document."""
    features = (shared.num_heads, 2 * shared.head_dim)
    return {
        'sinks': fifo.create(batch_size, config.num_sinks, features, dtype),
        'window': fifo.create(batch_size, config.window - 1, features, dtype),
        'doc_start': jnp.zeros((batch_size,), jnp.int32),
        'last_segment': jnp.full((batch_size,), -1, jnp.int32),
    }

  def _mask_and_far(self, ctx, doc_start, keys: fifo.FifoMemory, num_past: int):
    """Allowed `[b, q, k]` pairs and which of them are out-of-window sinks.

    `keys` is [sink store (s); window FIFO (w - 1); chunk]: the store is used
    only outside the window, the FIFO only inside it (so a token in both is
    counted once), the chunk's own tokens by either rule.
    """
    distance = ctx.positions[:, :, None] - keys.positions[:, None, :]
    same_doc = keys.valid[:, None, :] & (ctx.segment_ids[:, :, None] == keys.segment_ids[:, None, :])
    in_window = (distance >= 0) & (distance < self.config.window)
    is_sink = ((distance >= 0)
               & (keys.positions[:, None, :] - doc_start[:, :, None] < self.config.num_sinks))
    slot = jnp.arange(keys.capacity)[None, None, :]
    num_sinks = self.config.num_sinks
    from_store, from_fifo = slot < num_sinks, (slot >= num_sinks) & (slot < num_past)
    allowed = same_doc & jnp.where(from_store, is_sink & ~in_window,
                                   jnp.where(from_fifo, in_window, in_window | is_sink))
    return allowed, allowed & ~in_window

  @nn.compact
  def __call__(self, x: jax.Array, state: dict, ctx: AttentionContext):
    sinks = fifo.clear_rows(state['sinks'], ctx.reset)
    window = fifo.clear_rows(state['window'], ctx.reset)
    doc_start = document_starts(ctx, state['doc_start'], state['last_segment'])   # [b, c]

    heads, num_heads, head_dim = self.shared.heads, self.shared.num_heads, self.shared.head_dim
    q = heads.query(x, num_heads, head_dim, self.dtype)
    k, v = heads.keys_values(x, num_heads, head_dim, self.dtype)
    chunk = projections.chunk_entries(jnp.concatenate([k, v], axis=-1), ctx)
    keys = fifo.concat(fifo.concat(jax.lax.stop_gradient(sinks), jax.lax.stop_gradient(window)),
                       chunk)
    all_k, all_v = jnp.split(keys.values, 2, axis=-1)

    origin = ctx.positions[:, :1]
    extent = heads.extent(ctx.positions, ctx.valid)   # dynamic, longrope: the chunk's length
    k_rot = heads.rotate(all_k, keys.positions - origin, extent)
    backend = backends.resolve_backend(
        self.shared.attention_backend, _pattern(self.config.num_sinks, self.config.window),
        dtype=jnp.dtype(self.dtype).name, head_dim=head_dim)
    if backend == 'cudnn':
      out = self._cudnn_window(heads.rotate(q, ctx.positions - origin, extent), k_rot, all_v,
                               keys, ctx)
    else:
      out = self._dense(q, k_rot, all_v, keys, ctx, doc_start, sinks.capacity + window.capacity,
                        origin, extent)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))

    stored = jax.lax.stop_gradient(chunk)
    new_window, _ = fifo.insert(window, stored)
    new_state = {
        'sinks': updated_sinks(sinks, stored, doc_start, self.config.num_sinks),
        'window': new_window,
        'doc_start': doc_start[:, -1],
        'last_segment': ctx.segment_ids[:, -1],
    }
    return heads.output(out, self.shared.d_model, self.dtype), new_state, {}

  def _dense(self, q, k_rot, all_v, keys: fifo.FifoMemory, ctx: AttentionContext, doc_start,
             num_past: int, origin, extent):
    """Sinks and window, one dense masked softmax over `[sinks; window FIFO; chunk]`."""
    allowed, far = self._mask_and_far(ctx, doc_start, keys, num_past)
    logits = rotary_scores(self.shared.heads.rotate(q, ctx.positions - origin, extent), k_rot)
    if self.config.positions == 'cache' and self.shared.heads.rotary:
      # Sinks sit right before the window in the cache: the dropped tokens
      # between them do not count (Xiao et al., 2023, section 3.2).
      gap = jnp.maximum(0, ctx.positions - self.config.window + 1
                        - (doc_start + self.config.num_sinks))
      sink_logits = rotary_scores(
          self.shared.heads.rotate(q, ctx.positions - gap - origin, extent), k_rot)
      logits = jnp.where(far[:, None], sink_logits, logits)
    logits = logits / jnp.sqrt(self.shared.head_dim).astype(self.dtype)
    return attend(logits, allowed, all_v)

  def _cudnn_window(self, q_rot, k_rot, all_v, keys: fifo.FifoMemory, ctx: AttentionContext):
    """No sinks: the window of `w` keys through cuDNN over the `[window FIFO; chunk]` slots
    (core/cudnn_window.py; the FIFO's slots ask no query) -> `[b, c, h, d]`."""
    past = keys.capacity - ctx.positions.shape[1]
    scale = self.shared.head_dim ** -0.5
    pad_front = lambda a, value=0.0: jnp.pad(
        a, ((0, 0), (past, 0)) + ((0, 0),) * (a.ndim - 2), constant_values=value)

    def fallback(q_slots, k_, v_):
      out, lse = blocked_window_attention(
          q_slots[:, past:], k_, v_, ctx.positions, ctx.segment_ids, keys.positions,
          keys.segment_ids, keys.valid, window=self.config.window - 1,
          block_size=auto_block_size(max(self.config.window - 1, 1)), causal=True, key_offset=past,
          scale=scale)
      return pad_front(out), pad_front(lse, -jnp.inf)

    out = cudnn_window.window_attention(
        pad_front(q_rot), k_rot, all_v, keys.positions, keys.segment_ids, keys.valid,
        window=self.config.window - 1, scale=scale, fallback=fallback)
    return out[:, past:].astype(self.dtype)


def _pattern(num_sinks: int, window: int) -> backends.KernelPattern:
  """The window of `w` keys (`-(w - 1)..0`) alone goes to cuDNN's sliding window (imported
  Mistral / Qwen2 windows); sinks add keys outside it at other rotary distances: xla."""
  return backends.KernelPattern(left=window - 1, right=0, in_chunk=False, dense_mask_ok=False,
                                cudnn_window=True,
                                unsupported='attention sinks' if num_sinks else '')

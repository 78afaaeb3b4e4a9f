"""The time-shifted layer stack for Attendre's delayed queries.

An Attendre layer with a Q memory of N queries answers, at each step, the
queries it evicts: its output for a chunk belongs to the positions N before
the chunk's (attention/attendre.py). In a residual block the skip path must
be delayed by the same N, and the next layer must be told the positions,
documents and padding of what it now receives. This stack does both: each
layer keeps a FIFO delay line of N block inputs (the residual) and of
per-token document-start flags, exactly as long as the layer's Q memory, so
layer i's output at a step is the stream delayed by D_i = N_1 + ... + N_i.
Layers of other variants (or N = 0) have no delay line (capacity 0).

    x_out = delay_N(x) + Attn(LN(x));   x_out += FFN(LN(x_out))

To finish an input of a continuous stream, push the last D = total_delay
queries out with padding tokens (`valid` False, positions continuing):
- flush: one extra step whose chunk is D padding tokens (`padding_context(ctx, D)`);
- drain: ceil(D / C) padding chunks of the usual length C.
Both give the same outputs (padding never displaces a valid memory entry).
Output j of a step belongs to stream index (input index of slot j) - D.

Parameters are named as in the standard stack (`layer_{i}/attention_norm`,
`attention`, `feed_forward_norm`, `feed_forward`), so a checkpoint of the
standard stack runs here unchanged. Unrolled pre-LN layers only (a layer
schedule is fine; `scan_layers`, remat and other block kinds are not
supported: `AttendreDelayConfig` checks them). The residual delay line
is not stop-gradient: a delayed token's gradient reaches the step it came
from through the chunk scan.

State per layer: `{'attention': the variant's state, 'residual': FifoMemory
values [batch, N, d_model], 'starts': FifoMemory values [batch, N] bool}`, and
where a layer hides predicted keys (`attendre.hide_predicted`) `'predicted'`, a
delay line of the tokens' `ctx.predicted` flags [batch, N] bool, so that every
layer is told which of the positions it receives are predicted.
"""

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer
from longformer_jax.config.section import Section
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.memory import fifo
from longformer_jax.models.standard_stack import BlockStack
from longformer_jax.models.layer_schedule import layer_config

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


@dataclasses.dataclass(frozen=True)
class AttendreDelayConfig(Section):
  """`config.model.attendre_delay`: no settings; checks the shared ones the stack cannot honour.

  (An Attendre layer with a Q memory needs this stack: `AttendreConfig` checks that.)
  """

  def validate(self, env) -> None:
    if env is None:
      return
    if env.model.scan_layers:
      raise ConfigError('model.scan_layers', "True: the time-shifted stack runs unrolled "
                        "layers; use scan_layers=False with stack='attendre_delay'")
    if env.model.remat_policy != 'none':
      raise ConfigError('model.remat_policy', f'{env.model.remat_policy!r}: the time-shifted '
                        "stack does not rematerialise; use remat_policy='none'")
    if env.model.block != 'pre_ln':
      raise ConfigError('model.block', f'{env.model.block!r}: the time-shifted stack builds '
                        "its own pre-LN blocks (with a delayed skip path); use block='pre_ln'")


def hides_predicted(config) -> bool:
  """Some layer hides predicted keys from earlier queries (`attendre.hide_predicted`)."""
  return any(cfg.attention == 'attendre' and cfg.attendre.hide_predicted
             for cfg in (layer_config(config, i) for i in range(config.num_layers)))


def layer_delay(layer_cfg) -> int:
  """Positions by which a layer delays its output (its Q memory size, if Attendre)."""
  return layer_cfg.attendre.q_memory_size if layer_cfg.attention == 'attendre' else 0


def total_delay(config) -> int:
  """D: the delay of the whole stack, the sum over layers."""
  return sum(layer_delay(layer_config(config, i)) for i in range(config.num_layers))


def drain_chunks(delay: int, chunk_len: int) -> int:
  """Padding chunks of `chunk_len` that push a delay of `delay` out: ceil(delay / chunk_len)."""
  return -(-delay // chunk_len)


def finishing_lengths(config, chunk_len: int, mode: str) -> list[int]:
  """Lengths of the padding steps that finish an input: 'flush' or 'drain'."""
  delay = total_delay(config)
  if delay == 0:
    return []
  if mode == 'flush':
    return [delay]
  require(mode == 'drain', 'mode', f"must be 'flush' or 'drain', got {mode!r}")
  return [chunk_len] * drain_chunks(delay, chunk_len)


def padding_positions(positions: jax.Array, segment_ids: jax.Array, length: int):
  """`(positions, segment_ids)` `[batch, length]` of padding after `[batch, n]` ones: the
  positions continue, the last segment id repeats."""
  padded = positions[:, -1:] + 1 + jnp.arange(length, dtype=positions.dtype)[None]
  return padded, jnp.broadcast_to(segment_ids[:, -1:], padded.shape)


def padding_context(last: AttentionContext, length: int) -> AttentionContext:
  """`length` padding tokens after the chunk `last`: positions continue, nothing valid."""
  positions, segments = padding_positions(last.positions, last.segment_ids, length)
  return AttentionContext(positions=positions, segment_ids=segments,
                          reset=jnp.zeros(positions.shape[:1], bool),
                          valid=jnp.zeros(positions.shape, bool),
                          deterministic=last.deterministic)


def token_starts(ctx: AttentionContext) -> jax.Array:
  """`[batch, chunk]` bool: the token starts a document (reset, or a new segment id)."""
  changes = ctx.segment_ids[:, 1:] != ctx.segment_ids[:, :-1]
  return jnp.concatenate([ctx.reset[:, None], changes], axis=1)


def delayed(line: fifo.FifoMemory, values: jax.Array, ctx: AttentionContext):
  """Pushes `values [batch, chunk, ...]` (tagged with ctx) through a delay line."""
  return fifo.insert(line, fifo.FifoMemory(values=values, positions=ctx.positions,
                                           segment_ids=ctx.segment_ids, valid=ctx.valid))


class TimeShiftedBlock(nn.Module):
  """Pre-LN block with a delayed skip path.

  `(x [b, c, d_model], state, ctx) -> (x, (state, aux), delayed ctx)`.
  """
  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, state: dict, ctx: AttentionContext):
    cfg = self.config
    norm = NormConfig()   # the defaults: this block reads no norm setting (NORM_BLOCKS)
    attention = attention_layer(cfg, self.dtype)
    h, attention_state, aux = attention(norm_layer(norm, 'attention_norm', self.dtype)(x),
                                        state['attention'], ctx)
    residual, skip = delayed(state['residual'], x, ctx)
    starts, skip_starts = delayed(state['starts'], token_starts(ctx), ctx)
    new_state = {'residual': residual, 'starts': starts}
    skip_predicted = None
    if 'predicted' in state:
      new_state['predicted'], skip_predicted = delayed(state['predicted'],
                                                       ctx.predicted_flags(), ctx)
      skip_predicted = skip_predicted.values
    out_ctx = AttentionContext(positions=skip.positions, segment_ids=skip.segment_ids,
                               reset=skip_starts.values[:, 0], valid=skip.valid,
                               predicted=skip_predicted, deterministic=ctx.deterministic)
    x = skip.values + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    feed_forward = FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate,
                               self.dtype, name='feed_forward')
    h = feed_forward(norm_layer(norm, 'feed_forward_norm', self.dtype)(x),
                     deterministic=ctx.deterministic)
    x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x, ({'attention': attention_state, **new_state}, aux), out_ctx


class TimeShiftedStack(nn.Module):
  """`(x [batch, chunk, d_model], states (per layer), ctx) -> (x, states, aux per layer)`.

  The output is the stream delayed by `total_delay(config)` positions.
  """
  Config = AttendreDelayConfig

  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config, batch_size: int, dtype=jnp.float32) -> tuple:
    states = []
    attention_states = BlockStack.init_state(config, batch_size, dtype)
    carry_predicted = hides_predicted(config)
    for i in range(config.num_layers):
      cfg = layer_config(config, i)
      delay = layer_delay(cfg)
      states.append({
          'attention': attention_states[i],
          'residual': fifo.create(batch_size, delay, (cfg.d_model,), dtype),
          'starts': fifo.create(batch_size, delay, (), bool)})
      if carry_predicted:
        states[-1]['predicted'] = fifo.create(batch_size, delay, (), bool)
    return tuple(states)

  @nn.compact
  def __call__(self, x: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    new_states, auxes = [], []
    for i in range(cfg.num_layers):
      layer_cfg = layer_config(cfg, i)
      x, (state, aux), ctx = TimeShiftedBlock(layer_cfg, self.dtype, name=f'layer_{i}')(
          x, states[i], ctx)
      new_states.append(state)
      auxes.append(aux)
    return x, tuple(new_states), tuple(auxes)

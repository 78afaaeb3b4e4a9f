"""The Reformer's reversible layer stack (Kitaev et al., 2020, sec. 4): `model.stack='reversible'`.

The stream is duplicated, `x1 = x2 = x`, and each layer computes

  y1 = x1 + F(x2),  F = Dropout(Attention(LN(.))),
  y2 = x2 + G(y1),  G = Dropout(FeedForward(LN(.)))    (`ff_chunk_size` chunks it),

through `longformer_jax.layers.reversible.reversible_sequence`, whose custom
VJP rebuilds every layer's input from its output during the backward pass:
activation memory for training does not grow with depth. The stack returns
the mean of the two streams, `(y1 + y2) / 2` `[batch, chunk, d_model]`
(the Reformer concatenates them before its output layer; the stack
interface keeps `d_model`).

Any attention variant can be F (`layer_schedule` works, one config per
layer). Memory: each layer's state is an input that is kept for the
backward pass, not rebuilt; the new state is computed in the forward pass
and returned, and gradients flow through memories exactly as the variant
defines (the built-in variants stop the gradient of what they store).
Auxiliary values of the attention (`aux`) are returned per layer and their
losses train F's parameters through the custom VJP.

Parameters have the pre-LN block's names (`layer_i/attention_norm`,
`layer_i/attention`, `layer_i/feed_forward_norm`, `layer_i/feed_forward`).
Dropout masks (and LSH's per-step rotations) come from one key per layer
half, so the recomputation in the backward pass sees the same masks.
The stack is unrolled: `scan_layers` and `remat_policy` (it recomputes
already) are config errors (`ReversibleConfig.validate`).
"""

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.config.section import Section
from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.layers.reversible import reversible_sequence
from longformer_jax.models.layer_schedule import layer_config

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel

HALVES = ('attention', 'feed_forward')  # F, G; parameter names start with their half's name


@dataclasses.dataclass(frozen=True)
class ReversibleConfig(Section):
  """`config.model.reversible`: no settings; checks the shared ones the stack cannot honour."""

  def validate(self, env) -> None:
    if env is None:
      return
    if env.model.scan_layers:
      raise ConfigError('model.scan_layers', "True: the reversible stack is unrolled; use "
                        "scan_layers=False with stack='reversible'")
    if env.model.remat_policy != 'none':
      raise ConfigError('model.remat_policy', f'{env.model.remat_policy!r}: the reversible stack '
                        "recomputes activations itself; use remat_policy='none'")


class ReversibleLayer(nn.Module):
  """F or G of one layer: `(x [batch, chunk, d_model], state, ctx, half) -> (h, extra)`.

  `half='attention'`: `extra = (new_state, aux)`; `half='feed_forward'`:
  `state` is unused and `extra = ()`.
  """
  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext, half: str):
    cfg = self.config
    norm = NormConfig()   # the defaults: this block reads no norm setting (NORM_BLOCKS)
    if half == 'attention':
      attention = attention_layer(cfg, self.dtype)
      h, state, aux = attention(norm_layer(norm, 'attention_norm', self.dtype)(x), state, ctx)
      extra = (state, aux)
    else:
      feed_forward = FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate,
                                 self.dtype, name='feed_forward')
      h = feed_forward(norm_layer(norm, 'feed_forward_norm', self.dtype)(x),
                       deterministic=ctx.deterministic)
      extra = ()
    h = nn.Dropout(cfg.dropout_rate, name=f'{half}_dropout')(h, deterministic=ctx.deterministic)
    return nn.with_logical_constraint(h, ('batch', 'length', 'embed')), extra


class LayerAt(nn.Module):
  """Layer `index` as a root module, for pure applies (its path is `layer_<index>/...`,
  which LSH's fixed rotations are derived from)."""
  config: 'ResolvedModel'
  dtype: jnp.dtype
  index: int

  @nn.compact
  def __call__(self, x, state, ctx, half):
    return ReversibleLayer(self.config, self.dtype, name=f'layer_{self.index}')(x, state, ctx, half)


def split_halves(layer_params: dict) -> tuple[dict, dict]:
  """A layer's parameters -> (F's, G's), by the name prefix of each submodule."""
  halves = tuple({name: value for name, value in layer_params.items() if name.startswith(half)}
                 for half in HALVES)
  unknown = set(layer_params) - set(halves[0]) - set(halves[1])
  if unknown:
    raise ValueError(f'parameters outside the attention / feed_forward halves: {sorted(unknown)}')
  return halves


def residual_fn(config, dtype, index: int, half: str):
  """F or G of layer `index` as a pure `(params, x, (state, ctx, key)) -> (h, extra)`."""
  module = LayerAt(config, dtype, index, parent=None)

  def apply(params, x, side):
    state, ctx, key = side
    rngs = {} if key is None else {'dropout': key}
    return module.apply({'params': {f'layer_{index}': params}}, x, state, ctx, half, rngs=rngs)
  return apply


class ReversibleStack(nn.Module):
  """`(x [batch, chunk, d_model], states (per layer), ctx) -> (x, states, aux per layer)`."""
  Config = ReversibleConfig

  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config, batch_size: int, dtype=jnp.float32) -> tuple:
    """Each layer's empty memory, from its own (scheduled) config."""
    return tuple(attention_state(layer_config(config, i), batch_size, dtype)
                 for i in range(config.num_layers))

  def dropout_keys(self, ctx: AttentionContext) -> list:
    """One key per layer half when training (None: deterministic)."""
    count = 2 * self.config.num_layers
    if ctx.deterministic or not self.has_rng('dropout'):
      return [None] * count
    return list(jax.random.split(self.make_rng('dropout'), count))

  @nn.compact
  def __call__(self, x: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    configs = [layer_config(cfg, i) for i in range(cfg.num_layers)]
    layers = [ReversibleLayer(c, self.dtype, name=f'layer_{i}') for i, c in enumerate(configs)]
    keys = self.dropout_keys(ctx)
    if self.is_initializing():
      # Creates the parameters (by the direct computation, same function).
      x1 = x2 = x
      extras = []
      for layer, state in zip(layers, states):
        h, attention_extra = layer(x2, state, ctx, 'attention')
        x1 = x1 + h
        h, _ = layer(x1, None, ctx, 'feed_forward')
        x2 = x2 + h
        extras.append((attention_extra, ()))
    else:
      fns = [tuple(residual_fn(c, self.dtype, i, half) for half in HALVES)
             for i, c in enumerate(configs)]
      params = [split_halves(self.variables['params'][f'layer_{i}']) for i in range(cfg.num_layers)]
      sides = [((states[i], ctx, keys[2 * i]), (None, ctx, keys[2 * i + 1]))
               for i in range(cfg.num_layers)]
      x1, x2, extras = reversible_sequence(fns, params, x, x, sides)
    new_states = tuple(attention_extra[0] for attention_extra, _ in extras)
    auxes = tuple(attention_extra[1] for attention_extra, _ in extras)
    x = nn.with_logical_constraint((x1 + x2) / 2, ('batch', 'length', 'embed'))
    return x, new_states, auxes

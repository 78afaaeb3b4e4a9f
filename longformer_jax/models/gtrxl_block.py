"""The GTrXL block (Parisotto et al., 2019): gates in place of both residuals.

  Y  = Attn(LN(x));   x' = gate_1(x, ReLU(Y))
  Z  = FFN(LN(x'));   x'' = gate_2(x', ReLU(Z))

Layer norm is applied on the input stream of each sub-layer only (the
"identity map reordering"), and the ReLU on the sub-layer outputs follows
the paper (`relu`, default True). Any attention variant can be used.
Settings: `config.model.gtrxl` (`GTrXLConfig`): `gate` ('gru' | 'output' |
'highway'), `gate_bias` (b_g, default 2.0: the gate starts near the
identity), `relu`.
"""

import dataclasses
import math
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_layer
from longformer_jax.config.section import Section
from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.layers.gating import GATE_TYPES, Gate
from longformer_jax.layers.norms import NormConfig, norm_layer

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


@dataclasses.dataclass(frozen=True)
class GTrXLConfig(Section):
  """`config.model.gtrxl`: the gates of `model.block='gtrxl'`."""
  gate: str = 'gru'         # gru | output | highway (layers/gating.py)
  gate_bias: float = 2.0    # b_g; > 0 starts each block near the identity
  relu: bool = True         # ReLU on the sub-layer outputs, as in the paper

  def validate(self, env) -> None:
    del env
    self.require(self.gate in GATE_TYPES, 'gate', f'must be one of {GATE_TYPES}')
    self.require(math.isfinite(self.gate_bias), 'gate_bias', 'must be a finite number')


class GatedBlock(nn.Module):
  """`(x [batch, chunk, d_model], state, ctx) -> (x, (state, aux))`, like `DecoderBlock`."""
  Config = GTrXLConfig

  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  def _activate(self, y: jax.Array) -> jax.Array:
    return nn.relu(y) if self.config.gtrxl.relu else y

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    cfg = self.config
    kind, bias = cfg.gtrxl.gate, cfg.gtrxl.gate_bias
    norm = NormConfig()   # the defaults: this block reads no norm setting (NORM_BLOCKS)
    attention = attention_layer(cfg, self.dtype)
    y, state, aux = attention(norm_layer(norm, 'attention_norm', self.dtype)(x), state, ctx)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=ctx.deterministic)
    x = Gate(kind, bias, self.dtype, name='attention_gate')(x, self._activate(y))
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    feed_forward = FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate,
                               self.dtype, name='feed_forward')
    z = feed_forward(norm_layer(norm, 'feed_forward_norm', self.dtype)(x),
                     deterministic=ctx.deterministic)
    z = nn.Dropout(cfg.dropout_rate)(z, deterministic=ctx.deterministic)
    x = Gate(kind, bias, self.dtype, name='feed_forward_gate')(x, self._activate(z))
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x, (state, aux)

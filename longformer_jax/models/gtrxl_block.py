"""The GTrXL block (Parisotto et al., 2019): gates in place of both residuals.

  Y  = Attn(LN(x));   x' = gate_1(x, ReLU(Y))
  Z  = FFN(LN(x'));   x'' = gate_2(x', ReLU(Z))

Layer norm is applied on the input stream of each sub-layer only (the
"identity map reordering"), and the ReLU on the sub-layer outputs follows
the paper (`gtrxl_relu`, default True). Any attention variant can be used.
Config keys: `gtrxl_gate` ('gru' | 'output' | 'highway'), `gtrxl_gate_bias`
(b_g, default 2.0: the gate starts near the identity), `gtrxl_relu`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.attention.registry import attention_class
from longformer_jax.layers.feed_forward import feed_forward_from_config
from longformer_jax.layers.gating import Gate
from longformer_jax.layers.norms import layer_norm


class GatedBlock(nn.Module):
  """`(x [batch, chunk, d_model], state, ctx) -> (x, (state, aux))`, like `DecoderBlock`."""
  config: ml_collections.FrozenConfigDict
  dtype: jnp.dtype = jnp.float32

  def _activate(self, y: jax.Array) -> jax.Array:
    return nn.relu(y) if self.config.get('gtrxl_relu', True) else y

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    cfg = self.config
    kind, bias = cfg.get('gtrxl_gate', 'gru'), cfg.get('gtrxl_gate_bias', 2.0)
    attention = attention_class(cfg.attention).from_config(cfg, self.dtype, name='attention')
    y, state, aux = attention(layer_norm('attention_norm', self.dtype)(x), state, ctx)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=ctx.deterministic)
    x = Gate(kind, bias, self.dtype, name='attention_gate')(x, self._activate(y))
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    z = feed_forward_from_config(cfg, self.dtype)(
        layer_norm('feed_forward_norm', self.dtype)(x), deterministic=ctx.deterministic)
    z = nn.Dropout(cfg.dropout_rate)(z, deterministic=ctx.deterministic)
    x = Gate(kind, bias, self.dtype, name='feed_forward_gate')(x, self._activate(z))
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x, (state, aux)

"""Position-wise feed-forward network (Vaswani et al., 2017, eq. 2; GELU)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.layers.linear import projection


class FeedForward(nn.Module):
  """`[batch, length, d_model] -> [batch, length, d_model]` through `d_ff`."""
  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    h = projection(self.d_ff, kernel_axes=('embed', 'mlp'), name='wi',
                   dtype=self.dtype, use_bias=True, bias_axes=('mlp',))(x)
    h = nn.gelu(h)
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return projection(self.d_model, kernel_axes=('mlp', 'embed'), name='wo',
                      dtype=self.dtype, use_bias=True, bias_axes=('embed',))(h)

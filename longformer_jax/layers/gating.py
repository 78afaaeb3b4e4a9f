"""Gating layers that replace residual connections (GTrXL, Parisotto et al., 2019).

`gate(x, y)` combines the residual stream `x [batch, length, d_model]` with a
sub-layer's output `y` (eqs. 3-8 of the paper's section 3.2):

- `gru` (the paper's best):
    r = sigmoid(W_r y + U_r x)
    z = sigmoid(W_z y + U_z x - b_g)
    h = tanh(W_g y + U_g (r * x))
    g = (1 - z) * x + z * h
  With b_g > 0 the update gate z starts near 0, so g starts near x: the
  block begins close to the identity (the paper uses b_g = 2).
- `output`: g = x + sigmoid(W_g x - b_g) * y; saturated open (the gate at 1)
  it is the plain residual x + y.
- `highway`: g = sigmoid(W_g x + b_g) * x + (1 - sigmoid(W_g x + b_g)) * y.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.layers.linear import projection

GATE_TYPES = ('gru', 'output', 'highway')


class Gate(nn.Module):
  """`(x, y) -> g`, all `[batch, length, d_model]`; `bias` is b_g.

  `kind` and `bias` are the block's settings (`model.gtrxl.gate`, `model.gtrxl.gate_bias`,
  `models/gtrxl_block.GTrXLConfig`, which holds their defaults).
  """
  kind: str
  bias: float
  dtype: jnp.dtype = jnp.float32

  def _proj(self, name: str, v: jax.Array) -> jax.Array:
    return projection(v.shape[-1], kernel_axes=('embed', None), name=name, dtype=self.dtype)(v)

  @nn.compact
  def __call__(self, x: jax.Array, y: jax.Array) -> jax.Array:
    if self.kind == 'gru':
      r = jax.nn.sigmoid(self._proj('w_r', y) + self._proj('u_r', x))
      z = jax.nn.sigmoid(self._proj('w_z', y) + self._proj('u_z', x) - self.bias)
      h = jnp.tanh(self._proj('w_g', y) + self._proj('u_g', r * x))
      return (1.0 - z) * x + z * h
    if self.kind == 'output':
      return x + jax.nn.sigmoid(self._proj('w_g', x) - self.bias) * y
    if self.kind == 'highway':
      carry = jax.nn.sigmoid(self._proj('w_g', x) + self.bias)
      return carry * x + (1.0 - carry) * y
    raise ValueError(f'unknown gate {self.kind!r}; choose one of {GATE_TYPES}')

"""Layer normalisation with a logically named scale and bias."""

import flax.linen as nn
import jax.numpy as jnp


def layer_norm(name: str, dtype=jnp.float32) -> nn.LayerNorm:
  """LayerNorm over the last (`embed`) axis; statistics in float32."""
  return nn.LayerNorm(
      epsilon=1e-6,
      dtype=dtype,
      param_dtype=jnp.float32,
      use_fast_variance=False,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('embed',)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ('embed',)),
      name=name)

"""Normalisation layers with a logically named scale (and bias).

`layer_norm`: LayerNorm (Ba et al., 2016) with scale and bias. `rms_norm`:
RMSNorm (Zhang & Sennrich, 2019), `x / sqrt(mean(x^2) + eps) * scale`, no
mean subtraction and no bias (Llama). `norm_from_config` picks one from the
shared settings `model.norm` and `model.norm_epsilon`.
"""

import flax.linen as nn
import jax.numpy as jnp

NORMS = ('layer_norm', 'rms_norm')
DEFAULT_EPSILON = 1e-6


def layer_norm(name: str, dtype=jnp.float32, epsilon: float = DEFAULT_EPSILON) -> nn.LayerNorm:
  """LayerNorm over the last (`embed`) axis; statistics in float32."""
  return nn.LayerNorm(
      epsilon=epsilon,
      dtype=dtype,
      param_dtype=jnp.float32,
      use_fast_variance=False,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('embed',)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ('embed',)),
      name=name)


def rms_norm(name: str, dtype=jnp.float32, epsilon: float = DEFAULT_EPSILON) -> nn.RMSNorm:
  """RMSNorm over the last (`embed`) axis; statistics in float32; parameter `scale`."""
  return nn.RMSNorm(
      epsilon=epsilon,
      dtype=dtype,
      param_dtype=jnp.float32,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('embed',)),
      name=name)


def norm_from_config(cfg, name: str, dtype=jnp.float32):
  """The norm the shared settings name (`model.norm`, `model.norm_epsilon`)."""
  kind = cfg.norm
  epsilon = cfg.norm_epsilon
  if kind == 'rms_norm':
    return rms_norm(name, dtype, epsilon)
  return layer_norm(name, dtype, epsilon)

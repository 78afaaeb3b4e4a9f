"""Normalisation layers with a logically named scale (and bias), and their settings.

`layer_norm`: LayerNorm (Ba et al., 2016) with scale and bias. `rms_norm`:
RMSNorm (Zhang & Sennrich, 2019), `x / sqrt(mean(x^2) + eps) * scale`, no
mean subtraction and no bias (Llama). `norm_layer(config, name, dtype)`
builds the one its section `NormConfig` names.

`NormConfig` declares the settings, their defaults and their rules. The model
settings (`models/model_settings.ModelConfig`) inherit its fields, so the keys
stay flat: `model.norm`, `model.norm_epsilon`. A block takes the section of
its layer's resolved model config with `NormConfig.of(config)`.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from longformer_jax.config.section import Section

NORMS = ('layer_norm', 'rms_norm')


@dataclasses.dataclass(frozen=True)
class NormConfig(Section):
  """The norms' settings (`model.norm`, `model.norm_epsilon`)."""
  norm: str = 'layer_norm'         # layer_norm | rms_norm, in the blocks and the final norm
  norm_epsilon: float = 1e-6

  def validate(self, env) -> None:
    del env
    self.require(self.norm in NORMS, 'norm', f'must be one of {NORMS}')
    self.require(self.norm_epsilon > 0, 'norm_epsilon', 'must be > 0')


def layer_norm(name: str, dtype, epsilon: float) -> nn.LayerNorm:
  """LayerNorm over the last (`embed`) axis; statistics in float32."""
  return nn.LayerNorm(
      epsilon=epsilon,
      dtype=dtype,
      param_dtype=jnp.float32,
      use_fast_variance=False,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('embed',)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ('embed',)),
      name=name)


def rms_norm(name: str, dtype, epsilon: float) -> nn.RMSNorm:
  """RMSNorm over the last (`embed`) axis; statistics in float32; parameter `scale`."""
  return nn.RMSNorm(
      epsilon=epsilon,
      dtype=dtype,
      param_dtype=jnp.float32,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('embed',)),
      name=name)


def norm_layer(config: NormConfig, name: str, dtype=jnp.float32):
  """The norm `config` names, in parameter scope `name`."""
  if config.norm == 'rms_norm':
    return rms_norm(name, dtype, config.norm_epsilon)
  return layer_norm(name, dtype, config.norm_epsilon)

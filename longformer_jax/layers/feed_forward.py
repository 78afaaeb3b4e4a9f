"""Position-wise feed-forward network (Vaswani et al., 2017, eq. 2), optionally chunked.

Activations (`model.ff_activation`): 'gelu' (the tanh approximation, GPT-2's
`gelu_new`): `wo(gelu(wi(x)))`; 'gelu_exact' (the erf form, BERT and
RoBERTa/Longformer); 'relu' (the original Transformer, T5 v1.0):
`wo(relu(wi(x)))`; 'swiglu' (Shazeer, 2020, eq. 6; Llama):
`wo(silu(wi(x)) * wi_up(x))`, one more input projection `wi_up`; 'geglu'
(Shazeer, 2020, eq. 5, with the tanh GELU; T5 v1.1's `gated-gelu`):
`wo(gelu(wi(x)) * wi_up(x))`. Biases on every projection unless
`model.ff_bias` is False (Llama, T5).

`FeedForwardConfig` declares the settings, their defaults and their rules.
The model settings (`models/model_settings.ModelConfig`) inherit its fields, so
the keys stay flat: `model.d_ff`, `model.ff_chunk_size`, `model.ff_activation`,
`model.ff_bias`. A block builds the layer from its resolved model config:
`FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate, dtype)`.

With `model.ff_chunk_size > 0` the sequence is processed that many positions at a
time (Reformer, Kitaev et al., 2020, sec. 4 "Chunking"): an `nn.scan` over
chunks of a rematerialised body, so that the backward pass keeps only the
chunks' inputs and recomputes one chunk's `[batch, ff_chunk_size, d_ff]` hidden
activations at a time instead of storing them for the whole sequence. The
result is the same function with the same parameters (`wi`, `wi_up`, `wo`); a length
that is not a multiple of `ff_chunk_size` ends with one shorter chunk. With
dropout, chunks draw independent masks, so the masks (not their
distribution) differ from the unchunked layer's.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.config.section import Section
from longformer_jax.layers.linear import projection

FF_ACTIVATIONS = ('gelu', 'gelu_exact', 'relu', 'swiglu', 'geglu')
GATED_ACTIVATIONS = ('swiglu', 'geglu')   # these add the input projection `wi_up`


@dataclasses.dataclass(frozen=True)
class FeedForwardConfig(Section):
  """The feed-forward's settings (`model.d_ff`, `model.ff_*`)."""
  d_ff: int = 1024
  ff_chunk_size: int = 0           # > 0: feed-forward over chunks of this many tokens
  ff_activation: str = 'gelu'      # gelu (tanh approximation) | gelu_exact | relu | swiglu |
                                   # geglu (the module docstring)
  ff_bias: bool = True             # biases on the feed-forward projections

  def validate(self, env) -> None:
    del env
    self.require(self.d_ff > 0, 'd_ff', 'must be a positive integer')
    self.require(self.ff_chunk_size >= 0, 'ff_chunk_size', 'must be >= 0 (0: no chunking)')
    self.require(self.ff_activation in FF_ACTIVATIONS, 'ff_activation',
                 f'must be one of {FF_ACTIVATIONS}')


class FeedForward(nn.Module):
  """`[batch, length, d_model] -> [batch, length, d_model]` through `config.d_ff`.

  `config.ff_chunk_size`: 0 processes the whole length at once; > 0 scans
  over chunks of that many positions (module docstring). `d_model` and
  `dropout_rate` (on the hidden activations) are the model's, with no default here.
  """
  config: FeedForwardConfig
  d_model: int
  dropout_rate: float
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    # Assigned in setup (the attribute is the parameter scope name) so that the
    # chunked path's `nn.scan` can reach them through the module it lifts.
    cfg = self.config
    self.wi = projection(cfg.d_ff, kernel_axes=('embed', 'mlp'), name=None, dtype=self.dtype,
                         use_bias=cfg.ff_bias, bias_axes=('mlp',))
    if cfg.ff_activation in GATED_ACTIVATIONS:
      self.wi_up = projection(cfg.d_ff, kernel_axes=('embed', 'mlp'), name=None,
                              dtype=self.dtype, use_bias=cfg.ff_bias, bias_axes=('mlp',))
    self.wo = projection(self.d_model, kernel_axes=('mlp', 'embed'), name=None, dtype=self.dtype,
                         use_bias=cfg.ff_bias, bias_axes=('embed',))
    self.dropout = nn.Dropout(self.dropout_rate)

  def position_wise(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """The network itself on `[batch, length, d_model]`."""
    activation = self.config.ff_activation
    if activation == 'swiglu':
      h = nn.silu(self.wi(x)) * self.wi_up(x)
    elif activation == 'geglu':
      h = nn.gelu(self.wi(x)) * self.wi_up(x)     # approximate=True: the tanh form
    elif activation == 'gelu_exact':
      h = nn.gelu(self.wi(x), approximate=False)
    elif activation == 'relu':
      h = nn.relu(self.wi(x))
    else:
      h = nn.gelu(self.wi(x))  # approximate=True: the tanh form
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    h = self.dropout(h, deterministic=deterministic)
    return self.wo(h)

  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    batch, length, d_model = x.shape
    size = self.config.ff_chunk_size
    if size <= 0 or length <= size:
      return self.position_wise(x, deterministic)
    whole = length - length % size
    chunks = jnp.swapaxes(x[:, :whole].reshape(batch, whole // size, size, d_model), 0, 1)

    def one_chunk(module, carry, chunk):  # chunk [batch, size, d_model]
      return carry, module.position_wise(chunk, deterministic)

    scan = nn.scan(nn.remat(one_chunk), variable_broadcast='params',
                   split_rngs={'params': False, 'dropout': True})
    _, outputs = scan(self, None, chunks)
    y = jnp.swapaxes(outputs, 0, 1).reshape(batch, whole, d_model)
    if whole < length:
      y = jnp.concatenate([y, self.position_wise(x[:, whole:], deterministic)], axis=1)
    return y


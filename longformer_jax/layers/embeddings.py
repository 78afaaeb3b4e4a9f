"""Token embedding, the output projection (tied or untied) and learned absolute positions."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.layers.linear import projection


class TokenEmbedding(nn.Module):
  """Embeds token ids and turns hidden states back into vocabulary logits."""
  vocab_size: int
  d_model: int
  tie_embeddings: bool             # model.tie_embeddings (False: the output is its own projection)
  dtype: jnp.dtype
  scale_tied_logits: bool          # model.scale_tied_logits: tied logits divided by
                                   # sqrt(d_model) (False: GPT-2, Llama)

  def setup(self):
    self.table = self.param(
        'embedding',
        nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ('vocab', 'embed')),
        (self.vocab_size, self.d_model), jnp.float32)
    if not self.tie_embeddings:
      self.output = projection(self.vocab_size, kernel_axes=('embed', 'vocab'),
                               name='output', dtype=self.dtype)

  def embed(self, tokens: jax.Array) -> jax.Array:
    """`[batch, length]` int -> `[batch, length, d_model]` in the compute dtype."""
    return jnp.take(self.table, tokens, axis=0).astype(self.dtype)

  def logits(self, x: jax.Array) -> jax.Array:
    """`[batch, length, d_model]` -> float32 `[batch, length, vocab]`."""
    if self.tie_embeddings:
      # Scaled so that logits are O(1) for a unit-variance table. The input
      # token's own logit starts large (the top of the residual stream is
      # still mostly its embedding), so the initial loss is above ln(vocab).
      # A d^-1/2 table avoids that but measured far slower early training on
      # the built-in corpus (2.85 vs 1.67 nats at step 150), so we keep it.
      y = jnp.einsum('bld,vd->blv', x, self.table.astype(self.dtype))
      if self.scale_tied_logits:
        y = y / jnp.sqrt(self.d_model).astype(self.dtype)
    else:
      y = self.output(x)
    return y.astype(jnp.float32)


class PositionEmbedding(nn.Module):
  """Learned absolute position embeddings (GPT-2's `wpe`): `[batch, length]` positions ->
  `[batch, length, d_model]`. Positions past the table's last row read that row."""
  max_positions: int
  d_model: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, positions: jax.Array) -> jax.Array:
    table = self.param(
        'embedding',
        nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, 'embed')),
        (self.max_positions, self.d_model), jnp.float32)
    return jnp.take(table, positions, axis=0, mode='clip').astype(self.dtype)

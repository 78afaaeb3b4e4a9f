"""Bidirectional encoder and its task heads: sequence classification and span QA.

The encoder is the layer stack of the decoder LM run with `causal=False` on a
whole example at once (one chunk, fresh memory, every row reset), as the
Longformer encoder of Beltagy et al. (2020, sec. 6): with
`model.attention='longformer'` each token sees a sliding window, and tokens
flagged in `ctx.global_flags` ([CLS] for classification, the question for QA)
attend to all tokens and are attended by all.

Heads (sec. 6.1 of the paper, as in BERT/RoBERTa):
  * `SequenceClassifier`: the [CLS] (first) token's final state (`model.pooling='cls'`)
    or the mean of the valid tokens' final states (`'mean'`, as the Long Range
    Arena's Pathfinder models) through a tanh pooler, then a linear layer to
    `num_classes` logits.
  * `SpanExtractor`: one linear layer to start and end logits per token.
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.layers.embeddings import TokenEmbedding
from longformer_jax.layers.linear import projection
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.input_embedding import embed_inputs
from longformer_jax.models.post_ln_block import ends_normalised
from longformer_jax.models.stack_registry import stack_class

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


def encoder_context(input_mask: jax.Array, global_flags: jax.Array,
                    deterministic: bool) -> AttentionContext:
  """The context of whole examples `[batch, length]`: one document per row, positions 0..L-1.

  Every row is reset (no memory carries over between examples); padding
  (`input_mask` False) is never attended to.
  """
  batch, length = input_mask.shape
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  return AttentionContext(positions=positions, segment_ids=jnp.zeros_like(positions),
                          reset=jnp.ones((batch,), bool), valid=input_mask.astype(bool),
                          global_flags=global_flags.astype(bool), deterministic=deterministic)


def fresh_states(config: 'ResolvedModel', batch_size: int):
  """Every layer's empty memory (the encoder never carries memory across examples)."""
  stack = stack_class(config.stack)
  return stack.init_state(config, batch_size, compute_dtype(config.dtype))


class Encoder(nn.Module):
  """`(x [batch, length, d_model] embedded, ctx) -> (h [batch, length, d_model], aux per layer)`.

  `config.causal` must be False (`models/resolved_model.encoder_model_config`); `h` is after the
  final layer norm (post-LN blocks end normalised and have none).
  """
  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, ctx: AttentionContext):
    cfg = self.config
    states = fresh_states(cfg, x.shape[0])
    stack = stack_class(cfg.stack)(cfg, self.dtype, name='blocks')
    x, _, aux = stack(x, states, ctx)
    if ends_normalised(cfg):
      return x, aux
    return norm_layer(NormConfig.of(cfg), 'final_norm', self.dtype)(x), aux


def embed_tokens(cfg, tokens: jax.Array, ctx: AttentionContext,
                 dtype) -> tuple[jax.Array, TokenEmbedding]:
  """`tokens [b, L]` -> `([b, L, d_model], the tied embedding)` (scope `embedding`).

  Learned positions, when the model has them, are read at `ctx.positions`
  (0..L-1 for an encoder); `models/input_embedding.py`.
  """
  embedding = TokenEmbedding(cfg.vocab_size, cfg.d_model, True, dtype,
                             cfg.scale_tied_logits, name='embedding')
  return embed_inputs(cfg, embedding, tokens, ctx.positions, ctx.deterministic, dtype), embedding


def pool_states(pooling: str, h: jax.Array, valid: jax.Array) -> jax.Array:
  """`h [b, L, d]` -> `[b, d]`: the first token's state ('cls') or the mean over the tokens
  where `valid [b, L]` ('mean'; a row with none gives 0)."""
  if pooling == 'cls':
    return h[:, 0]
  weights = valid.astype(h.dtype)[..., None]
  return jnp.sum(h * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)


def pooled_output(cfg, h: jax.Array, ctx: AttentionContext, dtype) -> jax.Array:
  """`h [b, L, d_model]` -> `[b, d_model]`: `cfg.pooling` of the final states through BERT's
  tanh layer (scope `pooler` of the calling module) and dropout. Call it inside a compact
  `__call__`."""
  pooled = projection(cfg.d_model, kernel_axes=('embed', 'mlp'), name='pooler', dtype=dtype,
                      use_bias=True, bias_axes=('mlp',))(pool_states(cfg.pooling, h, ctx.valid))
  return nn.Dropout(cfg.dropout_rate)(jnp.tanh(pooled), deterministic=ctx.deterministic)


class SequenceClassifier(nn.Module):
  """`(tokens [b, L], ctx) -> (logits [b, num_classes] float32, aux)`; token 0 is [CLS] when
  `config.pooling` is 'cls'.

  `config.num_classes` sets the output size.
  """
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, tokens: jax.Array, ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    x, _ = embed_tokens(cfg, tokens, ctx, dtype)
    h, aux = Encoder(cfg, dtype, name='encoder')(x, ctx)
    pooled = pooled_output(cfg, h, ctx, dtype)
    logits = projection(cfg.num_classes, kernel_axes=('mlp', None), name='classifier',
                        dtype=dtype, use_bias=True, bias_axes=(None,))(pooled)
    return logits.astype(jnp.float32), aux


class SpanExtractor(nn.Module):
  """`(tokens [b, L], ctx) -> (start_logits [b, L], end_logits [b, L], aux)`, float32."""
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, tokens: jax.Array, ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    x, _ = embed_tokens(cfg, tokens, ctx, dtype)
    h, aux = Encoder(cfg, dtype, name='encoder')(x, ctx)
    logits = projection(2, kernel_axes=('embed', None), name='span', dtype=dtype,
                        use_bias=True, bias_axes=(None,))(h).astype(jnp.float32)
    return logits[..., 0], logits[..., 1], aux

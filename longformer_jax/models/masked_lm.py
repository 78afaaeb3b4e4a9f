"""A bidirectional encoder with RoBERTa's masked-language-model head (imported Longformer).

    h = Encoder(embed(tokens))                       models/encoder.py
    logits = LN(gelu(h W + b)) E^T + b_vocab         E: the tied token embeddings

(Liu et al., 2019; the head of BERT, Devlin et al., 2019, with the exact erf
GELU.) Its parameter scopes `embedding`, `position_embedding`,
`embedding_norm` and `encoder` are those of `SequenceClassifier` and
`SpanExtractor`, so an imported checkpoint's encoder is also theirs; the head
adds `lm_head_dense`, `lm_head_norm` (`model.norm`, `model.norm_epsilon`) and
`lm_head_bias`.
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.layers.linear import projection
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.encoder import Encoder, embed_tokens

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


class MaskedLM(nn.Module):
  """`(tokens [b, L], ctx) -> (logits [b, L, vocab_size] float32, aux per layer)`.

  `config`: an encoder model config (`resolved_model.encoder_model_config`: `causal=False`,
  `vocab_size` set); `ctx` as `encoder_context` makes it.
  """
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, tokens: jax.Array, ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    x, embedding = embed_tokens(cfg, tokens, ctx, dtype)
    h, aux = Encoder(cfg, dtype, name='encoder')(x, ctx)
    h = projection(cfg.d_model, kernel_axes=('embed', 'mlp'), name='lm_head_dense', dtype=dtype,
                   use_bias=True, bias_axes=('mlp',))(h)
    h = norm_layer(NormConfig.of(cfg), 'lm_head_norm', dtype)(nn.gelu(h, approximate=False))
    bias = self.param('lm_head_bias', nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ('vocab',)), (cfg.vocab_size,), jnp.float32)
    logits = embedding.logits(h) + bias
    return nn.with_logical_constraint(logits, ('batch', 'length', 'vocab')), aux

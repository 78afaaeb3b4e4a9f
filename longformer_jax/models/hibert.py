"""HIBERT (Zhang, Wei & Zhou, 2019): a hierarchical document encoder and its two heads.

  sentence encoder   the bidirectional encoder of `models/encoder.py` over each
                     sentence's tokens `[BOS] w_1 .. w_n`, all sentences of the
                     batch in one call (`[batch * sentences, tokens]`); a
                     sentence's vector is its first token's (BOS) final state
                     (the paper takes the EOS state, sec. 3.1; BOS needs no gather)
  document encoder   the same encoder over the sentence vectors plus sinusoidal
                     sentence-position embeddings (sec. 3.1) -> `[batch, sentences, d_model]`

Both encoders are `model.*` stacks (any attention variant, bidirectional)
with `model.hibert.sentence_layers` and `document_layers` layers; padding
tokens and padding sentences are masked (`ctx.valid`). One token embedding
(scope `hibert/embedding`) is shared by the encoder and the decoder and tied
to the decoder's output logits.

Heads:
  * `HibertPretrainer` (task `sentence_mask`, sec. 3.2): a causal Transformer
    decoder (`encoder_decoder.DecoderLayer`, `model.hibert.decoder_layers`)
    predicts each masked sentence's tokens; it cross-attends to the document
    encoder's output at that sentence's position (a single key).
  * `HibertExtractor` (task `extractive`, sec. 4): a linear layer over the
    document encoder's outputs -> one logit per sentence.

Parameters of the encoder live under `hibert/` in both heads, so fine-tuning
starts from a pretraining checkpoint by copying that subtree
(`tasks/hibert_init.py`).
"""

import dataclasses
import math
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.config.section import Section
from longformer_jax.layers.embeddings import TokenEmbedding
from longformer_jax.layers.linear import projection
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.layers.positional import sinusoid_embedding
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.encoder import Encoder, encoder_context
from longformer_jax.models.encoder_decoder import (DecoderLayer, decoder_context,
                                                   decoder_layer_config)

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


@dataclasses.dataclass(frozen=True)
class HibertConfig(Section):
  """`config.model.hibert` (tasks sentence_mask and extractive; which task reads which key:
  their `hibert_keys`, tasks/)."""
  sentence_layers: int = 2           # sentence encoder layers
  document_layers: int = 2           # document encoder layers
  max_sentences: int = 16            # sentences kept per document
  max_sentence_tokens: int = 64      # tokens per sentence, BOS included
  decoder_layers: int = 1            # sentence_mask: masked-sentence decoder layers
  mask_rate: float = 0.15            # sentence_mask: fraction of a document's sentences picked
  replace_mask: float = 0.8          # sentence_mask: of those, replaced by [MASK] tokens
  replace_random: float = 0.1        # sentence_mask: ... by a random sentence (the rest: unchanged)
  summary_sentences: int = 3         # extractive: sentences of the predicted summary
  init_from: str = ''                # extractive: workdir of a sentence_mask run to start from

  def validate(self, env) -> None:
    del env
    for name in ('sentence_layers', 'document_layers', 'decoder_layers', 'summary_sentences'):
      self.require(getattr(self, name) >= 1, name, 'must be >= 1')
    self.require(self.max_sentences >= 2, 'max_sentences', 'must be >= 2')
    self.require(self.max_sentence_tokens >= 2, 'max_sentence_tokens', 'must be >= 2 (BOS + 1)')
    self.require(0.0 < self.mask_rate <= 1.0, 'mask_rate', 'must be in (0, 1]')
    for name in ('replace_mask', 'replace_random'):
      self.require(0.0 <= getattr(self, name) <= 1.0, name, 'must be in [0, 1]')
    self.require(self.replace_mask + self.replace_random <= 1.0, 'replace_random',
                 f'+ replace_mask={self.replace_mask} must be <= 1')


def max_predictions(hibert) -> int:
  """Masked sentences per document at most: ceil(mask_rate * max_sentences)."""
  return max(1, math.ceil(hibert.mask_rate * hibert.max_sentences - 1e-9))


def stack_config(cfg: 'ResolvedModel', num_layers: int) -> 'ResolvedModel':
  """`cfg` with `num_layers` layers (the sentence or document encoder's stack)."""
  return dataclasses.replace(cfg, num_layers=num_layers)


def first_flags(mask: jax.Array) -> jax.Array:
  """Global flags on position 0 of every row (Longformer's [CLS]-style global token)."""
  return jnp.zeros(mask.shape, bool).at[..., 0].set(True)


class HibertEncoder(nn.Module):
  """`(tokens [b, S, T], token_mask [b, S, T], sentence_mask [b, S]) -> ([b, S, d_model], aux)`.

  `config` is an encoder model config (`resolved_model.encoder_model_config`) with
  the `hibert` section.
  """
  config: 'ResolvedModel'

  def setup(self):
    cfg = self.config
    self.dtype = compute_dtype(cfg.dtype)
    # Tied and scaled: HIBERT reads neither model.tie_embeddings nor model.scale_tied_logits.
    self.embedding = TokenEmbedding(cfg.vocab_size, cfg.d_model, True, self.dtype, True)
    self.sentence_encoder = Encoder(stack_config(cfg, cfg.hibert.sentence_layers), self.dtype)
    self.document_encoder = Encoder(stack_config(cfg, cfg.hibert.document_layers), self.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def embed(self, tokens: jax.Array, deterministic: bool) -> jax.Array:
    """`[n, T]` ids -> `[n, T, d_model]` with dropout."""
    return self.dropout(self.embedding.embed(tokens), deterministic=deterministic)

  def logits(self, y: jax.Array) -> jax.Array:
    return self.embedding.logits(y)

  def encode_sentences(self, tokens, token_mask, deterministic: bool):
    """One vector per sentence, all sentences in one call: `[b, S, T]` -> `([b, S, d_model], aux)`."""
    b, s, t = tokens.shape
    flat = tokens.reshape(b * s, t)
    # Position 0 stays valid in padding sentences so that no row is fully masked; their
    # vectors are masked by the document encoder.
    valid = token_mask.reshape(b * s, t).at[:, 0].set(True)
    ctx = encoder_context(valid, first_flags(valid), deterministic)
    h, aux = self.sentence_encoder(self.embed(flat, deterministic), ctx)
    return h[:, 0].reshape(b, s, -1), aux

  def encode_document(self, vectors, sentence_mask, deterministic: bool):
    """`[b, S, d_model]` sentence vectors -> `([b, S, d_model], aux)`; sec. 3.1: + sentence positions."""
    b, s, d = vectors.shape
    x = vectors + sinusoid_embedding(jnp.arange(s), d).astype(vectors.dtype)[None]
    x = self.dropout(x, deterministic=deterministic)
    valid = sentence_mask.astype(bool).at[:, 0].set(True)
    return self.document_encoder(x, encoder_context(valid, first_flags(valid), deterministic))

  def __call__(self, tokens, token_mask, sentence_mask, deterministic: bool):
    vectors, sentence_aux = self.encode_sentences(tokens, token_mask, deterministic)
    h, document_aux = self.encode_document(vectors, sentence_mask, deterministic)
    return h, tuple(sentence_aux) + tuple(document_aux)


class HibertPretrainer(nn.Module):
  """Masked sentence prediction (sec. 3.2).

  `(tokens, token_mask [b, S, T], sentence_mask [b, S], positions [b, P],
  decoder_inputs [b, P, T], decoder_mask [b, P, T], deterministic)` ->
  `(logits [b, P, T, vocab] float32, aux)`: `tokens` are the masked document,
  `positions` the masked sentences, `decoder_inputs` their original tokens
  (`[BOS] w_1 ..`, teacher forcing).
  """
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, tokens, token_mask, sentence_mask, positions, decoder_inputs, decoder_mask,
               deterministic: bool):
    cfg = self.config
    encoder = HibertEncoder(cfg, name='hibert')
    h, aux = encoder(tokens, token_mask, sentence_mask, deterministic)
    b, p, t = decoder_inputs.shape
    context = jnp.take_along_axis(h, positions[:, :, None], axis=1).reshape(b * p, 1, -1)
    mask = decoder_mask.reshape(b * p, t).at[:, 0].set(True)
    ctx = decoder_context(mask, deterministic)
    y = encoder.embed(decoder_inputs.reshape(b * p, t), deterministic)
    layer_cfg = decoder_layer_config(cfg)
    dtype = compute_dtype(cfg.dtype)
    decoder_aux = []
    for i in range(cfg.hibert.decoder_layers):
      y, layer_aux = DecoderLayer(layer_cfg, dtype, name=f'decoder_{i}')(
          y, context, jnp.ones((b * p, 1), bool), ctx)
      decoder_aux.append(layer_aux)
    y = norm_layer(NormConfig(), 'decoder_norm', dtype)(y)   # the default norm; model.norm unread
    logits = encoder.logits(y).astype(jnp.float32).reshape(b, p, t, -1)
    return logits, tuple(aux) + tuple(decoder_aux)


class HibertExtractor(nn.Module):
  """Extractive summarisation (sec. 4): `(tokens, token_mask, sentence_mask, deterministic)` ->
  `(logits [b, S] float32, aux)`, one logit per sentence (P(in summary) = sigmoid)."""
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, tokens, token_mask, sentence_mask, deterministic: bool):
    cfg = self.config
    h, aux = HibertEncoder(cfg, name='hibert')(tokens, token_mask, sentence_mask, deterministic)
    dtype = compute_dtype(cfg.dtype)
    logits = projection(1, kernel_axes=('embed', None), name='classifier', dtype=dtype,
                        use_bias=True, bias_axes=(None,))(h)
    return logits[..., 0].astype(jnp.float32), aux

"""LED, the Longformer encoder-decoder (Beltagy et al., 2020, sec. 7).

The encoder is `models/encoder.Encoder` over the long source (windowed
attention with `model.attention='longformer'`, global tokens from
`ctx.global_flags`); the decoder is a stack of `model.decoder_layers`
blocks, each with full causal self-attention (vanilla), full cross-attention
to the encoder's output (Vaswani et al., 2017, sec. 3.2.3) and the
feed-forward network. Encoder and decoder share the token embedding, which is
tied to the output logits (as in BART, which LED is initialised from) unless
`model.tie_embeddings` is False: then the output is its own projection
`embedding/output/kernel [d_model, vocab]`, as in the decoder LM
(layers/embeddings.py; T5 v1.1's `lm_head`).

The project's own LED (the defaults): pre-LN decoder layers with RoPE and a
final `decoder_norm`. The shared settings of imported checkpoints
(docs/import.md, convert/led.py) turn it into Hugging Face's LED, BART's layout:

- `position_embedding='learned'`: learned absolute positions on both sides,
  the source's table of `max_positions` rows (`position_embedding`), the
  target's of `decoder_max_positions` rows (`decoder_position_embedding`),
  each read at offsets 0.. of its sequence; q and k unrotated.
- `embedding_norm`: a norm after each side's embeddings (`embedding_norm`,
  `decoder_embedding_norm`).
- `block='post_ln'`: post-LN decoder layers, x = LN(x + SelfAttn(x)),
  x = LN(x + CrossAttn(x)), x = LN(x + FFN(x)), no final norm.
- `logits_bias`: a learned bias on the logits (`logits_bias [vocab]`, BART's
  `final_logits_bias`).
- `qkv_bias`, `out_bias`: biases on the self- and cross-attention's q/k/v and
  output projections; `ff_activation`, `ff_bias`: the feed-forward's;
  `norm`, `norm_epsilon`: the decoder's norms; `scale_tied_logits`.

and into T5 (convert/t5.py) with the pre-LN layers and final norms of the
defaults, `norm='rms_norm'` (T5LayerNorm), `ff_activation='relu'` or
`'geglu'` without biases, and `position_embedding='relative_buckets'`: no
positions on the inputs, a learned bias per (bucket of key - query, head) in
every self-attention layer, bidirectional buckets in the encoder,
unidirectional in the (causal) decoder; the cross-attention has none.
"""

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.frozen_mapping import FrozenMapping
from longformer_jax.layers.embeddings import TokenEmbedding
from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.encoder import Encoder
from longformer_jax.models.input_embedding import embed_inputs
from longformer_jax.models.post_ln_block import ends_normalised

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


def decoder_layer_config(config: 'ResolvedModel') -> 'ResolvedModel':
  """The config of a decoder layer's self-attention: vanilla, causal, no memory, no schedule."""
  return dataclasses.replace(config, attention='vanilla', causal=True, mem_len=0,
                             layer_schedule=FrozenMapping())


def decoder_context(decoder_mask: jax.Array, deterministic: bool) -> AttentionContext:
  """Context of the target sequences `[batch, target_len]`: positions 0.., one document per row."""
  batch, length = decoder_mask.shape
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  return AttentionContext(positions=positions, segment_ids=jnp.zeros_like(positions),
                          reset=jnp.ones((batch,), bool), valid=decoder_mask.astype(bool),
                          deterministic=deterministic)


class CrossAttention(nn.Module):
  """`(x [b, T, d_model], source [b, S, d_model], source_valid [b, S]) -> [b, T, d_model]`.

  Every target position attends to every valid source position; softmax in
  float32 (`dot_product.attend`), rows with no valid source give zeros.
  `shared` is the layer's attention settings (attention/shared_settings.py), as the
  self-attention's: its shape (`num_heads`, `head_dim`, `d_model`) and biases on q/k/v
  (`[heads, head_dim]`) and on the output (`[d_model]`) when `heads.qkv_bias` /
  `heads.out_bias` (`model.qkv_bias`, `model.out_bias`). No positions, no grouped keys.
  """
  shared: SharedSettings
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, source: jax.Array, source_valid: jax.Array) -> jax.Array:
    shared = self.shared
    heads = lambda h, name: projections.project_heads(h, shared.num_heads, shared.head_dim, name,
                                                      self.dtype, shared.heads.qkv_bias)
    q, k, v = heads(x, 'query'), heads(source, 'key'), heads(source, 'value')  # [b, ., h, hd]
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / jnp.sqrt(shared.head_dim).astype(self.dtype)
    mask = jnp.broadcast_to(source_valid[:, None, :], (x.shape[0], x.shape[1], source.shape[1]))
    out = attend(logits, mask, v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype, shared.heads.out_bias)


class DecoderLayer(nn.Module):
  """Self-attention, cross-attention to `source`, feed-forward; returns `(x, aux)`.

  Pre-LN (default): x + SelfAttn(LN(x)), + CrossAttn(LN(.), source), + FFN(LN(.)).
  Post-LN (`model.block='post_ln'`): the norm after each residual sum instead.
  Shapes: `x [b, T, d_model]`, `source [b, S, d_model]`, `source_valid [b, S]`.
  Parameter scopes either way: `self_attention`, `self_attention_norm`,
  `cross_attention`, `cross_attention_norm`, `feed_forward`, `feed_forward_norm`.
  """
  config: 'ResolvedModel'   # from `decoder_layer_config`
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, source, source_valid, ctx: AttentionContext):
    cfg = self.config
    post_ln = ends_normalised(cfg)
    norm_config = NormConfig.of(cfg)
    norm = lambda name: norm_layer(norm_config, name, self.dtype)
    # The sublayer reads LN(x) (pre-LN) or x (post-LN); its output is added to x,
    # and with post-LN the sum is normalised.
    sublayer_input = lambda x, name: x if post_ln else norm(name)(x)

    def add(x, h, name):
      x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
      return norm(name)(x) if post_ln else x

    state = attention_state(cfg, x.shape[0], self.dtype)
    h, _, aux = attention_layer(cfg, self.dtype, name='self_attention')(
        sublayer_input(x, 'self_attention_norm'), state, ctx)
    x = add(x, h, 'self_attention_norm')
    h = CrossAttention(SharedSettings.of(cfg), self.dtype, name='cross_attention')(
        sublayer_input(x, 'cross_attention_norm'), source, source_valid)
    x = add(x, h, 'cross_attention_norm')
    feed_forward = FeedForward(FeedForwardConfig.of(cfg), cfg.d_model, cfg.dropout_rate,
                               self.dtype, name='feed_forward')
    h = feed_forward(sublayer_input(x, 'feed_forward_norm'), deterministic=ctx.deterministic)
    x = add(x, h, 'feed_forward_norm')
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed')), aux



class EncoderDecoder(nn.Module):
  """`(source [b, S], source_ctx, target_inputs [b, T], target_ctx) -> (logits [b, T, vocab], aux)`.

  `config` is an encoder model config (`resolved_model.encoder_model_config`) with
  `decoder_layers`; logits are float32. `aux` holds the encoder's per-layer
  aux dicts then the decoder's.
  """
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, source: jax.Array, source_ctx: AttentionContext, target_inputs: jax.Array,
               target_ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    # Source: token embedding (+ learned positions, embedding norm), then dropout. The
    # embedding also makes the logits: tied (x @ E^T), or `output` when untied.
    embedding = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.tie_embeddings,
                               dtype, cfg.scale_tied_logits, name='embedding')
    x = embed_inputs(cfg, embedding, source, source_ctx.positions, source_ctx.deterministic, dtype)
    encoded, encoder_aux = Encoder(cfg, dtype, name='encoder')(x, source_ctx)

    layer_cfg = decoder_layer_config(cfg)
    y = embed_inputs(cfg, embedding, target_inputs, target_ctx.positions,
                     target_ctx.deterministic, dtype,
                     max_positions=cfg.decoder_max_positions, prefix='decoder_')
    decoder_aux = []
    for i in range(cfg.decoder_layers):
      y, aux = DecoderLayer(layer_cfg, dtype, name=f'decoder_{i}')(
          y, encoded, source_ctx.valid, target_ctx)
      decoder_aux.append(aux)
    if not ends_normalised(cfg):
      y = norm_layer(NormConfig.of(cfg), 'decoder_norm', dtype)(y)
    logits = embedding.logits(y)
    if cfg.logits_bias:  # BART's final_logits_bias
      logits = logits + self.param('logits_bias', nn.with_logical_partitioning(
          nn.initializers.zeros_init(), ('vocab',)), (cfg.vocab_size,), jnp.float32)
    logits = nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))
    return logits, tuple(encoder_aux) + tuple(decoder_aux)

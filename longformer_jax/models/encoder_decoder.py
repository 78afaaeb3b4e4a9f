"""LED, the Longformer encoder-decoder (Beltagy et al., 2020, sec. 7).

The encoder is `models/encoder.Encoder` over the long source (windowed
attention with `model.attention='longformer'`, global tokens from
`ctx.global_flags`); the decoder is a stack of `model.decoder_layers` pre-LN
blocks, each with full causal self-attention (vanilla, RoPE), full
cross-attention to the encoder's output (Vaswani et al., 2017, sec. 3.2.3)
and the feed-forward network. Encoder and decoder share the token embedding,
which is tied to the output logits (as in BART, which LED is initialised from).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core import cached_context
from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.registry import attention_class
from longformer_jax.layers.embeddings import TokenEmbedding
from longformer_jax.layers.feed_forward import FeedForward
from longformer_jax.layers.norms import layer_norm
from longformer_jax.models.decoder_lm import compute_dtype
from longformer_jax.models.encoder import Encoder


def decoder_layer_config(config: ml_collections.FrozenConfigDict) -> ml_collections.FrozenConfigDict:
  """The config of a decoder layer's self-attention: vanilla, causal, no memory, no schedule."""
  values = config.to_dict()
  values.update(attention='vanilla', causal=True, mem_len=0, layer_schedule={})
  return ml_collections.FrozenConfigDict(values)


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
  """
  num_heads: int
  head_dim: int
  d_model: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, source: jax.Array, source_valid: jax.Array) -> jax.Array:
    q = cached_context.project_heads(x, self.num_heads, self.head_dim, 'query', self.dtype)
    k = cached_context.project_heads(source, self.num_heads, self.head_dim, 'key', self.dtype)
    v = cached_context.project_heads(source, self.num_heads, self.head_dim, 'value', self.dtype)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / jnp.sqrt(self.head_dim).astype(self.dtype)
    mask = jnp.broadcast_to(source_valid[:, None, :], (x.shape[0], x.shape[1], source.shape[1]))
    out = attend(logits, mask, v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return cached_context.project_output(out, self.d_model, self.dtype)


class DecoderLayer(nn.Module):
  """Pre-LN: x + SelfAttn(LN(x)), + CrossAttn(LN(.), source), + FFN(LN(.)); returns `(x, aux)`."""
  config: ml_collections.FrozenConfigDict   # from `decoder_layer_config`
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, source, source_valid, ctx: AttentionContext):
    cfg = self.config
    drop = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)
    attention_cls = attention_class(cfg.attention)
    state = attention_cls.init_state(cfg, x.shape[0], self.dtype)
    h, _, aux = attention_cls.from_config(cfg, self.dtype, name='self_attention')(
        layer_norm('self_attention_norm', self.dtype)(x), state, ctx)
    x = x + drop(h)
    h = CrossAttention(cfg.num_heads, cfg.head_dim, cfg.d_model, self.dtype, name='cross_attention')(
        layer_norm('cross_attention_norm', self.dtype)(x), source, source_valid)
    x = x + drop(h)
    h = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout_rate, self.dtype, name='feed_forward')(
        layer_norm('feed_forward_norm', self.dtype)(x), deterministic=ctx.deterministic)
    x = nn.with_logical_constraint(x + drop(h), ('batch', 'length', 'embed'))
    return x, aux


class EncoderDecoder(nn.Module):
  """`(source [b, S], source_ctx, target_inputs [b, T], target_ctx) -> (logits [b, T, vocab], aux)`.

  `config` is an encoder model config (`encoder.encoder_model_config`) with
  `decoder_layers`; logits are float32. `aux` holds the encoder's per-layer
  aux dicts then the decoder's.
  """
  config: ml_collections.FrozenConfigDict

  @nn.compact
  def __call__(self, source: jax.Array, source_ctx: AttentionContext, target_inputs: jax.Array,
               target_ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    embedding = TokenEmbedding(cfg.vocab_size, cfg.d_model, True, dtype, name='embedding')
    drop = lambda h, ctx: nn.Dropout(cfg.dropout_rate)(h, deterministic=ctx.deterministic)

    x = drop(embedding.embed(source), source_ctx)
    encoded, encoder_aux = Encoder(cfg, dtype, name='encoder')(x, source_ctx)

    layer_cfg = decoder_layer_config(cfg)
    y = drop(embedding.embed(target_inputs), target_ctx)
    decoder_aux = []
    for i in range(cfg.decoder_layers):
      y, aux = DecoderLayer(layer_cfg, dtype, name=f'decoder_{i}')(
          y, encoded, source_ctx.valid, target_ctx)
      decoder_aux.append(aux)
    y = layer_norm('decoder_norm', dtype)(y)
    logits = nn.with_logical_constraint(embedding.logits(y), ('batch', 'length', 'vocab'))
    return logits, tuple(encoder_aux) + tuple(decoder_aux)

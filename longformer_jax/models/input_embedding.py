"""The model input: token embeddings, learned absolute positions, an embedding norm, dropout.

Shared by the decoder LM and the encoder models (`models/decoder_lm.py`,
`models/encoder.py`). Settings (all in `config.model`):

- `position_embedding = 'learned'` adds row `offset` of a table of
  `max_positions` rows (GPT-2's `wpe`, RoBERTa's `position_embeddings`) to
  each token's embedding; offsets past the table read its last row. The
  attention then leaves q and k unrotated. The caller gives the offsets: the
  decoder counts from its chunk's first position, an encoder from 0.
- `embedding_norm = True` normalises the sum (`model.norm`,
  `model.norm_epsilon`; RoBERTa's `embeddings.LayerNorm`), in scope
  `embedding_norm`.
"""

import flax.linen as nn
import jax

from longformer_jax.layers.embeddings import PositionEmbedding, TokenEmbedding
from longformer_jax.layers.norms import NormConfig, norm_layer


def embed_inputs(cfg, embedding: TokenEmbedding, tokens: jax.Array, offsets: jax.Array,
                 deterministic: bool, dtype, max_positions: int = 0,
                 prefix: str = '') -> jax.Array:
  """`tokens [batch, length]`, `offsets [batch, length]` -> `[batch, length, d_model]`.

  `max_positions` (default `model.max_positions`) and `prefix` (of the scopes
  `position_embedding`, `embedding_norm`) serve a second input with its own
  table and norm: the encoder-decoder's target (`decoder_`).
  """
  x = embedding.embed(tokens)
  if cfg.position_embedding == 'learned':
    x = x + PositionEmbedding(max_positions or cfg.max_positions, cfg.d_model, dtype,
                              name=f'{prefix}position_embedding')(offsets)
  if cfg.embedding_norm:
    x = norm_layer(NormConfig.of(cfg), f'{prefix}embedding_norm', dtype)(x)
  x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
  return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)

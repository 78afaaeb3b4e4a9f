"""The logits of the full causal model: one chunk holding the whole text, the reference the
cached decoders are held to."""

import jax.numpy as jnp
import numpy as np

from longformer_jax.generation.chunk_window_decoder import chunk_context
from longformer_jax.models.decoder_lm import DecoderLM


def full_logits(model_config, params, tokens: np.ndarray) -> np.ndarray:
  """`[len, vocab]` logits of one chunk holding the whole text (the full causal model)."""
  positions = jnp.arange(tokens.size, dtype=jnp.int32)[None, :]
  logits, _, _ = DecoderLM(model_config).apply(
      {'params': params}, jnp.asarray(tokens[None, :]), DecoderLM.init_state(model_config, 1),
      chunk_context(positions, tokens.size))
  return np.asarray(logits[0])

"""The image model (Image Transformer, Parmar et al., 2018): a causal decoder over one image.

Each row of a batch is one image (`data/image_data.py`): `inputs [b, L]` are
the intensities shifted right behind BOS, in the generation order of
`model.image_local.layout`. The model is the decoder LM of the language-model
task (`models/decoder_lm.DecoderLM`, so `model.attention` is any causal
variant; `image_local` is the paper's) run on the whole image as one chunk
with fresh, empty memory: positions 0..L-1, one document per row, nothing
padded. The task (its vocabulary: the intensity levels + BOS; loss and
metrics): `tasks/image.py`.
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.encoder import fresh_states
from longformer_jax.models.encoder_decoder import decoder_context

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


def image_context(inputs: jax.Array, deterministic: bool):
  """Context of whole images `[batch, L]`: positions 0..L-1, every row one document, all valid."""
  return decoder_context(jnp.ones(inputs.shape, bool), deterministic)


class ImageDecoder(nn.Module):
  """`(inputs [b, L], ctx) -> (logits [b, L, vocab] float32, aux per layer)`."""
  config: 'ResolvedModel'

  @nn.compact
  def __call__(self, inputs: jax.Array, ctx):
    states = fresh_states(self.config, inputs.shape[0])
    logits, _, aux = DecoderLM(self.config, name='decoder')(inputs, states, ctx)
    return logits.astype(jnp.float32), aux


"""The image task (Image Transformer, Parmar et al., 2018): a causal decoder over one image.

Each row of a batch is one image (`data/image_data.py`): `inputs [b, L]` are
the intensities shifted right behind BOS, `targets [b, L]` the intensities,
in the generation order of `model.image_local.layout`. The model is the
decoder LM of the language-model task (`models/decoder_lm.DecoderLM`, so
`model.attention` is any causal variant; `image_local` is the paper's) run
on the whole image as one chunk with fresh, empty memory: positions
0..L-1, one document per row, nothing padded.

The loss is the next-intensity cross-entropy over the `levels` intensities
only (the logits of BOS and of the vocabulary padding are dropped, so the
softmax is a distribution over intensities); its mean in nats per position
divided by ln 2 is **bits per dimension** (`evaluation/task_metrics.py`).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from longformer_jax.data import image_data
from longformer_jax.models.decoder_lm import DecoderLM, lm_model_config
from longformer_jax.models.encoder import fresh_states
from longformer_jax.models.encoder_decoder import decoder_context
from longformer_jax.train.lm_objective import weighted_aux_losses


def image_context(inputs: jax.Array, deterministic: bool):
  """Context of whole images `[batch, L]`: positions 0..L-1, every row one document, all valid."""
  return decoder_context(jnp.ones(inputs.shape, bool), deterministic)


class ImageDecoder(nn.Module):
  """`(inputs [b, L], ctx) -> (logits [b, L, vocab] float32, aux per layer)`."""
  config: ml_collections.FrozenConfigDict

  @nn.compact
  def __call__(self, inputs: jax.Array, ctx):
    states = fresh_states(self.config, inputs.shape[0])
    logits, _, aux = DecoderLM(self.config, name='decoder')(inputs, states, ctx)
    return logits.astype(jnp.float32), aux


def image_model(config: ml_collections.ConfigDict):
  """`(model_config, ImageDecoder)` of the run: vocabulary = intensity levels + BOS (padded)."""
  source = image_data.image_source(config.data.corpus)
  model_config = lm_model_config(config.model, source.vocab_size)
  return model_config, ImageDecoder(model_config)


def image_sums(model, params, batch: dict, rngs: dict, deterministic: bool, *,
               levels: int) -> dict:
  """Sums over the batch's real images (`weight`): `loss_sum` (nats) over `count` positions,
  `correct` (argmax hits), `examples`, `aux_objective`."""
  logits, aux = model.apply({'params': params}, batch['inputs'],
                            image_context(batch['inputs'], deterministic), rngs=rngs)
  logits = logits[..., :levels]                         # intensities only
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  mask = jnp.broadcast_to(batch['weight'][:, None], nll.shape)
  correct = (jnp.argmax(logits, axis=-1) == batch['targets']).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(nll * mask), 'count': jnp.sum(mask),
          'aux_objective': aux_objective, 'correct': jnp.sum(correct * mask),
          'examples': jnp.sum(batch['weight'])}


def image_sums_fn(config: ml_collections.ConfigDict, model):
  """`(params, batch, rngs, deterministic) -> sums` of the image task."""
  levels = image_data.image_source(config.data.corpus).levels
  return lambda params, batch, rngs, deterministic: image_sums(
      model, params, batch, rngs, deterministic, levels=levels)

"""Task `image` (Image Transformer, Parmar et al., 2018): a causal decoder over whole images.

Data: `data/image_data.py`, one image per row (`inputs [b, L]`, the
intensities behind BOS; `targets [b, L]`). Model:
`models/image_decoder.ImageDecoder`, a causal decoder LM run on the whole
image as one chunk (`model.causal`; 2D `image_local` attention sized to the
corpus' images).

The loss is the next-intensity cross-entropy over the `levels` intensities
only (the logits of BOS and of the vocabulary padding are dropped, so the
softmax is a distribution over intensities); its mean in nats per position
divided by ln 2 is **bits per dimension**. Metrics: `loss`, `bits_per_dim`,
`intensity_accuracy`, `dims`, `examples`; eval.py draws
`eval.image_samples` samples into `samples.png` (`evaluation/image_sampling.py`).
"""

import math
import os

import jax.numpy as jnp

from longformer_jax.config.errors import require
from longformer_jax.data import image_data
from longformer_jax.evaluation import image_sampling
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.image_decoder import ImageDecoder, image_context
from longformer_jax.tasks.base import ExampleTask, token_sums

SAMPLES_FILE = 'samples.png'


def image_sums(model, variables, batch: dict, rngs: dict, deterministic: bool, *,
               levels: int) -> dict:
  """Sums over the batch's real images (`weight`): `loss_sum` (nats) over `count` positions,
  `correct` (argmax hits), `examples`, `aux_objective`."""
  logits, aux = variables.apply(model, batch['inputs'],
                                image_context(batch['inputs'], deterministic), rngs=rngs)
  logits = logits[..., :levels]                         # intensities only
  mask = jnp.broadcast_to(batch['weight'][:, None], batch['targets'].shape)
  return token_sums(model, logits, aux, batch['targets'], mask, batch['weight'])


class ImageTask(ExampleTask):
  name = 'image'
  model_kind = 'decoder'
  data_module = image_data
  carries_model_state = False    # report_files samples with the parameters alone
  data_keys = ('max_examples',)
  eval_keys = ('image_samples',)
  columns = (('bits_per_dim', 'bits/dim'), ('intensity_accuracy', 'intensity accuracy'))

  def chunk_lengths(self, data, train, eval_, hibert) -> tuple:
    """The positions of one image of `data.corpus`."""
    del train, eval_, hibert
    return (image_data.image_source(data.corpus).length,)

  def check_model(self, data, model: dict) -> None:
    """A causal model; 2D image_local attention sized to the images of `data.corpus`."""
    require(model['causal'], 'model.causal', 'False: task image trains a causal decoder')
    source = image_data.image_source(data.corpus)
    section = model.get('image_local') or {}
    if model['attention'] != 'image_local' or section.get('layout') != '2d':
      return
    for key, want in (('image_height', source.height), ('image_width', source.row_len)):
      require(section[key] == want, f'model.image_local.{key}',
              f'{section[key]} must be {want} for {data.corpus!r} images of {source.height} x '
              f'{source.width} x {source.channels} (width counts channels)')

  def model(self, config, vocab_size: int):
    """`(model_config, ImageDecoder)`: vocabulary = intensity levels + BOS (padded); ignores
    `vocab_size`."""
    del vocab_size
    source = image_data.image_source(config.data.corpus)
    model_config = lm_model_config(config.model, source.vocab_size)
    return model_config, ImageDecoder(model_config)

  def init_arguments(self, batch: dict) -> tuple:
    return batch['inputs'], image_context(batch['inputs'], True)

  def sums_fn(self, config, model):
    levels = image_data.image_source(config.data.corpus).levels
    return lambda params, batch, rngs, deterministic: image_sums(
        model, params, batch, rngs, deterministic, levels=levels)

  def metrics(self, totals: dict) -> dict:
    metrics = super().metrics(totals)
    metrics.update(bits_per_dim=metrics['loss'] / math.log(2),
                   intensity_accuracy=totals['correct'] / max(totals['count'], 1.0),
                   dims=totals['count'])
    return metrics

  def report_files(self, config, model, params, out_dir: str) -> list:
    """`samples.png` of `eval.image_samples` drawn images (if any): `[(file, what)]`."""
    if not config.eval.image_samples:
      return []
    image_sampling.save_samples(config, model, params, os.path.join(out_dir, SAMPLES_FILE))
    return [(SAMPLES_FILE, f'{config.eval.image_samples} samples')]


TASK = ImageTask()

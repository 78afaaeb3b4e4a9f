"""Task `classification` (Longformer, sec. 6.1): one label per example from [CLS]'s final state.

Data: `data/classification_tasks.py`, `[CLS] + tokens` cut to `data.seq_len`.
Model: `models/encoder.SequenceClassifier` (`model.num_classes >= 2`). Sums
over the batch's real examples (`weight`): `loss_sum` (cross-entropy, nats)
over `count` examples, `correct`, `aux_objective`; metrics: `loss`,
`accuracy`, `examples`. Fine-tunes a Hugging Face Longformer
(`train.init_from_hf`).
"""

import functools

import jax.numpy as jnp
import optax

from longformer_jax.config.errors import require
from longformer_jax.data import classification_tasks
from longformer_jax.models.encoder import SequenceClassifier, encoder_context
from longformer_jax.tasks.base import ExampleTask
from longformer_jax.train.lm_objective import weighted_aux_losses


def classification_sums(model, variables, batch: dict, rngs: dict, deterministic: bool) -> dict:
  """Sums of `batch` (`inputs [b, L]`, `input_mask`, `global_flags`, `label [b]`, `weight [b]`)."""
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  logits, aux = variables.apply(model, batch['inputs'], ctx, rngs=rngs)
  weight = batch['weight']
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
  correct = (jnp.argmax(logits, axis=-1) == batch['label']).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(nll * weight), 'count': jnp.sum(weight),
          'aux_objective': aux_objective, 'correct': jnp.sum(correct * weight)}


class ClassificationTask(ExampleTask):
  name = 'classification'
  hf_checkpoint = 'encoder'
  data_module = classification_tasks
  model_class = SequenceClassifier
  data_keys = ('seq_len', 'max_examples', 'tfds_config')
  train_keys = ('eval_max_examples', 'init_from_hf')
  model_keys = ('num_classes',)
  columns = (('accuracy', 'accuracy'),)

  def check_model(self, data, model: dict) -> None:
    require(model['num_classes'] >= 2, 'model.num_classes',
            f"{model['num_classes']} must be >= 2 for task 'classification'")

  def hf_settings(self, data: dict, model: dict, settings: dict) -> None:
    """A fine-tuning config of an imported checkpoint (convert/workdir_cli.py): a classifier
    checkpoint's classes (its `num_classes` setting), else two."""
    del data
    model['num_classes'] = settings.get('num_classes') or 2

  def sums_fn(self, config, model):
    del config
    return functools.partial(classification_sums, model)

  def metrics(self, totals: dict) -> dict:
    metrics = super().metrics(totals)
    metrics['accuracy'] = totals['correct'] / max(totals['count'], 1.0)
    return metrics


TASK = ClassificationTask()

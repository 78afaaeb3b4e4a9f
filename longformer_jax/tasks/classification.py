"""Task `classification` (Longformer, sec. 6.1; the Long Range Arena's ListOps and Text): one label
per example from the pooled final states.

Data: `data/classification_tasks.py`, `[CLS] + tokens` cut to `data.seq_len`
(the tokens alone with `data.cls_token=False`). Model:
`models/encoder.SequenceClassifier` (`model.num_classes >= 2`, `model.pooling`).
Sums over the batch's real examples (`weight`): `loss_sum` (cross-entropy,
nats) over `count` examples, `correct`, `aux_objective`; metrics: `loss`,
`accuracy`, `examples`. Fine-tunes a Hugging Face Longformer
(`train.init_from_hf`) or a self-pretrained encoder (`train.init_from`, a
`masked_pretraining` run: tasks/pretrained_encoder.py).
"""

import functools

import jax.numpy as jnp
import optax

from longformer_jax.config.errors import require
from longformer_jax.data import classification_tasks
from longformer_jax.data.lra import listops
from longformer_jax.models.encoder import SequenceClassifier, encoder_context
from longformer_jax.tasks import pretrained_encoder
from longformer_jax.tasks.base import ExampleTask
from longformer_jax.train.lm_objective import weighted_aux_losses

# Classes of the corpora that have more than two.
CORPUS_CLASSES = {'listops': listops.NUM_CLASSES}


def label_sums(model, logits, aux, batch: dict) -> dict:
  """The sums of a batch of `logits [b, classes]` against `batch['label'] [b]`, over the rows
  whose `batch['weight'] [b]` is 1: `loss_sum`, `count`, `aux_objective`, `correct`."""
  weight = batch['weight']
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
  correct = (jnp.argmax(logits, axis=-1) == batch['label']).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(nll * weight), 'count': jnp.sum(weight),
          'aux_objective': aux_objective, 'correct': jnp.sum(correct * weight)}


def classification_sums(model, variables, batch: dict, rngs: dict, deterministic: bool) -> dict:
  """Sums of `batch` (`inputs [b, L]`, `input_mask`, `global_flags`, `label [b]`, `weight [b]`);
  `variables`: the `train/model_variables.ModelVariables` the model is applied with."""
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  logits, aux = variables.apply(model, batch['inputs'], ctx, rngs=rngs)
  return label_sums(model, logits, aux, batch)


class ClassificationTask(ExampleTask):
  name = 'classification'
  hf_checkpoint = 'encoder'
  data_module = classification_tasks
  model_class = SequenceClassifier
  data_keys = classification_tasks.DATA_KEYS
  train_keys = ('eval_max_examples', 'init_from_hf', 'init_from')
  model_keys = ('num_classes', 'pooling')
  columns = (('accuracy', 'accuracy'),)

  def check_data(self, data) -> None:
    classification_tasks.check_examples_fit(data)

  def check_model(self, data, model: dict) -> None:
    classes = CORPUS_CLASSES.get(data.corpus, 2)
    require(model['num_classes'] >= classes, 'model.num_classes',
            f"{model['num_classes']} must be >= {classes} for task {self.name!r} on corpus "
            f'{data.corpus!r}')
    require(data.cls_token or model['pooling'] != 'cls', 'model.pooling',
            "'cls' reads the [CLS] token, which data.cls_token=False leaves out; use 'mean'")

  def hf_settings(self, data: dict, model: dict, settings: dict) -> None:
    """A fine-tuning config of an imported checkpoint (convert/workdir_cli.py): a classifier
    checkpoint's classes (its `num_classes` setting), else two."""
    del data
    model['num_classes'] = settings.get('num_classes') or 2

  def check_init(self, config) -> None:
    pretrained_encoder.check_init_from(config)

  def initialise(self, config, state, mesh, rules):
    del rules
    return pretrained_encoder.with_pretrained_encoder(config, state, mesh)

  def sums_fn(self, config, model):
    del config
    return functools.partial(classification_sums, model)

  def metrics(self, totals: dict) -> dict:
    metrics = super().metrics(totals)
    metrics['accuracy'] = totals['correct'] / max(totals['count'], 1.0)
    return metrics


TASK = ClassificationTask()

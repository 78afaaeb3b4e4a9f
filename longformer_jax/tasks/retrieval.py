"""Task `retrieval`: does a pair of documents match? Two towers, one encoder (LRA's Retrieval).

Data: `data/retrieval_tasks.py`, pairs stacked as `[n, 2, seq_len]`. Model:
`models/dual_encoder.PairClassifier` (`model.num_classes >= 2`, `model.pooling`).
Sums and metrics as task `classification`'s (tasks/classification.py), over pairs.
"""

import functools

from longformer_jax.config.errors import require
from longformer_jax.data import retrieval_tasks
from longformer_jax.models.dual_encoder import PairClassifier
from longformer_jax.models.encoder import encoder_context
from longformer_jax.tasks.classification import ClassificationTask, label_sums


def pair_context(input_mask, global_flags, deterministic: bool):
  """The encoder context of the pairs' `2b` documents (`[b, 2, L]` masks, flattened in order)."""
  batch, pair, length = input_mask.shape
  return encoder_context(input_mask.reshape(batch * pair, length),
                         global_flags.reshape(batch * pair, length), deterministic)


def retrieval_sums(model, variables, batch: dict, rngs: dict, deterministic: bool) -> dict:
  """Sums of `batch` (`inputs [b, 2, L]`, `input_mask`, `global_flags`, `label [b]`, `weight [b]`);
  `variables`: the `train/model_variables.ModelVariables` the model is applied with."""
  ctx = pair_context(batch['input_mask'], batch['global_flags'], deterministic)
  logits, aux = variables.apply(model, batch['inputs'], ctx, rngs=rngs)
  return label_sums(model, logits, aux, batch)


class RetrievalTask(ClassificationTask):
  name = 'retrieval'
  hf_checkpoint = ''
  data_module = retrieval_tasks
  model_class = PairClassifier
  data_keys = ('seq_len', 'max_examples', 'cls_token', 'cls_global', 'lra_retrieval')
  train_keys = ('eval_max_examples',)

  def check_data(self, data) -> None:
    require(data.corpus in retrieval_tasks.CORPORA, 'data.corpus',
            f'{data.corpus!r} is not a corpus of task retrieval; choose one of '
            f'{retrieval_tasks.CORPORA}')

  def init_arguments(self, batch: dict) -> tuple:
    return batch['inputs'], pair_context(batch['input_mask'], batch['global_flags'], True)

  def sums_fn(self, config, model):
    del config
    return functools.partial(retrieval_sums, model)


TASK = RetrievalTask()

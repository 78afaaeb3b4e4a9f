"""Task `extractive`: HIBERT's extractive summarisation (Zhang et al., 2019, sec. 4).

Each document's sentences get oracle labels (`labels [n, S]`,
`tasks/hibert_extractive.py`); the model (`models/hibert.HibertExtractor`)
scores each sentence; the loss is the binary cross-entropy per real
sentence. Metrics: `loss`, `label_accuracy`, `sentences`, `examples`, and
(validation and eval.py) ROUGE-1/2/L of the top `model.hibert.summary_sentences`
sentences in document order. `model.hibert.init_from` starts from a
sentence_mask run (`tasks/hibert_init.py`).
"""

import functools

import ml_collections
import numpy as np

from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.hibert import HibertExtractor
from longformer_jax.tasks import hibert_extractive, hibert_init
from longformer_jax.tasks.hibert import SHARED_KEYS, HibertTask, token_masks


class ExtractiveTask(HibertTask):
  name = 'extractive'
  labelled = True
  model_class = HibertExtractor
  carries_model_state = False    # its ROUGE extras rank with the parameters alone
  hibert_keys = SHARED_KEYS + ('summary_sentences', 'init_from')
  columns = (('rouge1', 'ROUGE-1'), ('rouge2', 'ROUGE-2'), ('rougeL', 'ROUGE-L'),
             ('label_accuracy', 'label accuracy'))
  extra_metrics = ('rouge1', 'rouge2', 'rougeL')

  def load_arrays(self, config: ml_collections.ConfigDict, split: str, tokenizer) -> dict:
    """The documents' arrays and their oracle `labels [n, S]` (float32)."""
    hibert = config.model.hibert
    documents = self.load_documents(config, split)
    arrays = super().load_arrays(config, split, tokenizer)
    arrays['labels'] = hibert_extractive.oracle_labels(documents, hibert.max_sentences)
    return arrays

  def example_batch(self, config: ml_collections.ConfigDict, batch_size: int) -> dict:
    batch = super().example_batch(config, batch_size)
    batch['labels'] = np.zeros((batch_size, config.model.hibert.max_sentences), np.float32)
    return batch

  def init_arguments(self, batch: dict) -> tuple:
    return token_masks(batch) + (True,)

  def check_init(self, config: ml_collections.ConfigDict) -> None:
    hibert_init.check_init_from(config)

  def initialise(self, config: ml_collections.ConfigDict, state, mesh, rules):
    return hibert_init.with_pretrained_encoder(config, state, mesh, rules)

  def sums_fn(self, config, model):
    return functools.partial(hibert_extractive.extractive_sums, model,
                             pad_id=make_tokenizer(config.data).pad_id)

  def metrics(self, totals: dict) -> dict:
    metrics = super().metrics(totals)
    metrics.update(label_accuracy=totals['correct'] / max(totals['count'], 1.0),
                   sentences=totals['count'])
    return metrics

  def training_extras(self, config, split: str, model, params, batches) -> dict:
    """ROUGE-1/2/L of the predicted summaries of `split` (`hibert_extractive.selection_rouge`)."""
    return hibert_extractive.selection_rouge(
        model, params, batches, self.load_documents(config, split),
        config.model.hibert.summary_sentences, make_tokenizer(config.data).pad_id)

  def report_extras(self, config, split: str, model, params, batches, tokenizer) -> dict:
    del tokenizer
    return self.training_extras(config, split, model, params, batches)


TASK = ExtractiveTask()

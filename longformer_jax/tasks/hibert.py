"""What HIBERT's two tasks share: documents as sentences, the model, the config checks.

Examples are whole documents, `[sentences, tokens]` each
(`data/hibert_documents.py`); the model is `models/hibert.py`, both
encoders sized by `model.hibert` (so `model.num_layers` and
`model.layer_schedule` are errors). The vocabulary is the tokenizer's plus
one [MASK] id (`mask_id` = the tokenizer's vocabulary size). The tasks:
`tasks/sentence_mask.py` (pretraining) and `tasks/extractive.py`
(summarisation).
"""

import jax.numpy as jnp
import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import hibert_documents
from longformer_jax.models.resolved_model import encoder_model_config
from longformer_jax.models.model_config import ModelConfig
from longformer_jax.tasks.base import ExampleTask

# The model.hibert keys both tasks read.
SHARED_KEYS = ('sentence_layers', 'document_layers', 'max_sentences', 'max_sentence_tokens')


class HibertTask(ExampleTask):
  """The part of a HIBERT task its two tasks share (`labelled`: extractive's oracle labels)."""
  data_keys = ('max_examples',)
  labelled = False

  def chunk_lengths(self, data, train, eval_, hibert) -> tuple:
    """Sentence tokens (the sentence encoder) and sentences (the document encoder)."""
    del data, train, eval_
    return tuple(sorted({hibert.max_sentence_tokens, hibert.max_sentences}))

  def check_model_values(self, model_values: dict) -> None:
    for key in ('num_layers', 'layer_schedule'):
      if model_values.get(key, getattr(ModelConfig(), key)) != getattr(ModelConfig(), key):
        raise ConfigError(f'model.{key}', f'{model_values[key]!r} is ignored by task '
                          f'{self.name!r}: set model.hibert.sentence_layers and '
                          'model.hibert.document_layers')

  def complete_model(self, model: dict, hibert) -> None:
    model['hibert'] = hibert.to_dict()

  def load_documents(self, config: ml_collections.ConfigDict, split: str) -> list:
    """The split's `SentenceDocument`s, in the order of `load_arrays`' rows."""
    return hibert_documents.load_documents(config.data, split, self.labelled,
                                           config.data.max_examples)

  def load_arrays(self, config: ml_collections.ConfigDict, split: str, tokenizer) -> dict:
    """The split's arrays (`hibert_documents.sentence_arrays`)."""
    hibert = config.model.hibert
    return hibert_documents.sentence_arrays(self.load_documents(config, split), tokenizer,
                                            hibert.max_sentences, hibert.max_sentence_tokens)

  def example_batch(self, config: ml_collections.ConfigDict, batch_size: int) -> dict:
    """Zeros shaped like a batch of `batch_size` documents (for shapes only)."""
    hibert = config.model.hibert
    s, t = hibert.max_sentences, hibert.max_sentence_tokens
    return dict(sentences=np.zeros((batch_size, s, t), np.int32),
                targets=np.zeros((batch_size, s, t), np.int32),
                sentence_mask=np.zeros((batch_size, s), bool),
                example_index=np.zeros((batch_size,), np.int32),
                weight=np.zeros((batch_size,), np.float32))

  def model(self, config: ml_collections.ConfigDict, vocab_size: int):
    """`(model_config, model)`: vocabulary = the tokenizer's + [MASK]."""
    model_config = encoder_model_config(config.model, vocab_size + 1)
    return model_config, self.model_class(model_config)


def token_masks(batch: dict) -> tuple:
  """`(tokens [b, S, T], token_mask [b, S, T] all True, sentence_mask [b, S])` of `batch`."""
  tokens = batch['sentences']
  return tokens, jnp.ones(tokens.shape, bool), batch['sentence_mask']

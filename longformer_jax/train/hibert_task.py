"""HIBERT's two tasks for the fixed-size-example loop: `sentence_mask` and `extractive`.

Examples are whole documents, `[sentences, tokens]` each
(`data/hibert_documents.py`); the model is `models/hibert.py`. The
vocabulary is the tokenizer's plus one [MASK] id (`mask_id` = the
tokenizer's vocabulary size).

  sentence_mask (pretraining, sec. 3.2): each step masks sentences from the
      step's key (`train/hibert_masking.py`; evaluation: a fixed key) and
      scores the decoder's next-token loss over the picked sentences' tokens
      only (`[BOS] w_1 .. w_n` -> `w_1 .. w_n EOS`); metrics: loss per
      token, `token_accuracy`.
  extractive (sec. 4): oracle labels, BCE and ROUGE of the top sentences
      (`train/hibert_extractive.py`).
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from longformer_jax.data import hibert_documents
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.encoder import encoder_model_config
from longformer_jax.models.hibert import (HIBERT_TASKS, HibertExtractor, HibertPretrainer,
                                          max_predictions)
from longformer_jax.train import hibert_extractive
from longformer_jax.train.hibert_masking import mask_sentences
from longformer_jax.train.lm_objective import weighted_aux_losses

TASKS = HIBERT_TASKS
EVAL_MASK_SEED = 0          # evaluation masks: always the same
_MASKING_SALT = 0x48424552  # the step key is folded with this before masking


def load_documents(config: ml_collections.ConfigDict, split: str) -> list:
  """The split's `SentenceDocument`s, in the order of `load_arrays`' rows."""
  return hibert_documents.load_documents(config.data, split, config.task == 'extractive',
                                         config.data.max_examples)


def load_arrays(config: ml_collections.ConfigDict, split: str, tokenizer) -> dict:
  """The split's arrays (`hibert_documents.sentence_arrays`; extractive: + `labels [n, S]`)."""
  hibert = config.model.hibert
  documents = load_documents(config, split)
  arrays = hibert_documents.sentence_arrays(documents, tokenizer, hibert.max_sentences,
                                            hibert.max_sentence_tokens)
  if config.task == 'extractive':
    arrays['labels'] = hibert_extractive.oracle_labels(documents, hibert.max_sentences)
  return arrays


def example_batch(config: ml_collections.ConfigDict, batch_size: int) -> dict:
  """Zeros shaped like a batch of `batch_size` documents (for shapes only)."""
  hibert = config.model.hibert
  s, t = hibert.max_sentences, hibert.max_sentence_tokens
  batch = dict(sentences=np.zeros((batch_size, s, t), np.int32),
               targets=np.zeros((batch_size, s, t), np.int32),
               sentence_mask=np.zeros((batch_size, s), bool),
               example_index=np.zeros((batch_size,), np.int32),
               weight=np.zeros((batch_size,), np.float32))
  if config.task == 'extractive':
    batch['labels'] = np.zeros((batch_size, s), np.float32)
  return batch


def hibert_model(config: ml_collections.ConfigDict, vocab_size: int):
  """`(model_config, model)`: vocabulary = the tokenizer's + [MASK]."""
  model_config = encoder_model_config(config.model, vocab_size + 1)
  cls = HibertPretrainer if config.task == 'sentence_mask' else HibertExtractor
  return model_config, cls(model_config)


def init_arguments(task: str, batch: dict) -> tuple:
  """The positional arguments of the model's `__call__` for `batch` (for `init`)."""
  tokens, sentence_mask = batch['sentences'], batch['sentence_mask']
  token_mask = jnp.ones(tokens.shape, bool)
  if task == 'extractive':
    return tokens, token_mask, sentence_mask, True
  p = 1
  positions = jnp.zeros((tokens.shape[0], p), jnp.int32)
  return (tokens, token_mask, sentence_mask, positions, tokens[:, :p], token_mask[:, :p], True)


def masking_key(rngs: dict):
  """Training: the step's key (folded); evaluation (no rngs): a fixed key."""
  if 'dropout' in rngs:
    return jax.random.fold_in(rngs['dropout'], _MASKING_SALT)
  return jax.random.PRNGKey(EVAL_MASK_SEED)


def sentence_mask_sums(model, params, batch: dict, rngs: dict, deterministic: bool, *,
                       pad_id: int, mask_id: int) -> dict:
  """Sums over the masked sentences of the batch's real documents: `loss_sum` (nats) over
  `count` target tokens, `correct`, `examples`, `masked_sentences`, `aux_objective`."""
  hibert = model.config.hibert
  tokens, targets = batch['sentences'], batch['targets']
  masked = mask_sentences(
      masking_key(rngs), tokens, tokens != pad_id, batch['sentence_mask'],
      batch['example_index'], mask_rate=hibert.mask_rate, replace_mask=hibert.replace_mask,
      replace_random=hibert.replace_random, max_predictions=max_predictions(hibert),
      mask_id=mask_id)
  positions = masked['positions']
  gather = lambda x: jnp.take_along_axis(x, positions[:, :, None], axis=1)
  decoder_inputs, decoder_targets = gather(tokens), gather(targets)         # [b, P, T]
  target_mask = (decoder_targets != pad_id) & masked['slot_valid'][:, :, None]
  logits, aux = model.apply({'params': params}, masked['tokens'], masked['token_mask'],
                            batch['sentence_mask'], positions, decoder_inputs, target_mask,
                            deterministic, rngs=rngs)
  weight = batch['weight']
  mask = target_mask.astype(jnp.float32) * weight[:, None, None]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, decoder_targets)
  correct = (jnp.argmax(logits, axis=-1) == decoder_targets).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(nll * mask), 'count': jnp.sum(mask), 'aux_objective': aux_objective,
          'correct': jnp.sum(correct * mask), 'examples': jnp.sum(weight),
          'masked_sentences': jnp.sum(masked['slot_valid'] * weight[:, None])}


def hibert_sums_fn(config: ml_collections.ConfigDict, model):
  """`(params, batch, rngs, deterministic) -> sums` of `config.task`."""
  tokenizer = make_tokenizer(config.data)
  if config.task == 'sentence_mask':
    return functools.partial(sentence_mask_sums, model, pad_id=tokenizer.pad_id,
                             mask_id=tokenizer.vocab_size)
  return functools.partial(hibert_extractive.extractive_sums, model, pad_id=tokenizer.pad_id)


def extractive_rouge(config: ml_collections.ConfigDict, split: str, model, params, batches) -> dict:
  """ROUGE-1/2/L of the predicted summaries of `split` (`hibert_extractive.selection_rouge`)."""
  tokenizer = make_tokenizer(config.data)
  return hibert_extractive.selection_rouge(
      model, params, batches, load_documents(config, split),
      config.model.hibert.summary_sentences, tokenizer.pad_id)

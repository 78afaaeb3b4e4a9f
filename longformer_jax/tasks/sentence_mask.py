"""Task `sentence_mask`: HIBERT's pretraining (Zhang et al., 2019, sec. 3.2), masked sentences.

Each step masks sentences from the step's key (`tasks/hibert_masking.py`;
evaluation: a fixed key) and scores the decoder's next-token loss over the
picked sentences' tokens only (`[BOS] w_1 .. w_n` -> `w_1 .. w_n EOS`).
Model: `models/hibert.HibertPretrainer`. Sums: `loss_sum` (nats) over `count`
target tokens, `correct`, `examples`, `masked_sentences`, `aux_objective`;
metrics: `loss` per token, `token_accuracy`, `tokens`, `examples`.
"""

import functools

import jax.numpy as jnp

from longformer_jax.data import token_masking
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.hibert import HibertPretrainer, max_predictions
from longformer_jax.tasks.base import token_metrics, token_sums
from longformer_jax.tasks.hibert import SHARED_KEYS, HibertTask, token_masks
from longformer_jax.tasks.hibert_masking import mask_sentences

# The step's dropout key is folded with this before masking (data/token_masking.py).
masking_key = functools.partial(token_masking.masking_key, salt=0x48424552)


def sentence_mask_sums(model, variables, batch: dict, rngs: dict, deterministic: bool, *,
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
  logits, aux = variables.apply(model, masked['tokens'], masked['token_mask'],
                                batch['sentence_mask'], positions, decoder_inputs, target_mask,
                                deterministic, rngs=rngs)
  weight = batch['weight']
  mask = target_mask.astype(jnp.float32) * weight[:, None, None]
  sums = token_sums(model, logits, aux, decoder_targets, mask, weight)
  sums['masked_sentences'] = jnp.sum(masked['slot_valid'] * weight[:, None])
  return sums


class SentenceMaskTask(HibertTask):
  name = 'sentence_mask'
  model_class = HibertPretrainer
  hibert_keys = SHARED_KEYS + ('decoder_layers', 'mask_rate', 'replace_mask', 'replace_random')
  columns = (('token_accuracy', 'masked token accuracy'),)

  def init_arguments(self, batch: dict) -> tuple:
    tokens, token_mask, sentence_mask = token_masks(batch)
    p = 1
    positions = jnp.zeros((tokens.shape[0], p), jnp.int32)
    return (tokens, token_mask, sentence_mask, positions, tokens[:, :p], token_mask[:, :p], True)

  def sums_fn(self, config, model):
    tokenizer = make_tokenizer(config.data)
    return functools.partial(sentence_mask_sums, model, pad_id=tokenizer.pad_id,
                             mask_id=tokenizer.vocab_size)

  def metrics(self, totals: dict) -> dict:
    return token_metrics(super().metrics(totals), totals)


TASK = SentenceMaskTask()

"""Task `masked_pretraining`: self-pretraining, masked-token prediction on a task's own inputs.

Amos et al. (2024, "Never Train from Scratch") pretrain an encoder with a denoising objective
on the downstream task's training inputs alone (no other data, labels unread) and then
fine-tune it; on the Long Range Arena this closes most of the gap that training from scratch
leaves. This task is that first stage for the classification corpora (the same examples as
task `classification`, `data/classification_tasks.py`, their labels ignored): BERT's masking
(`data/token_masking.py`, `data.masking`) of the content tokens ([CLS] and padding are never
picked) and the cross-entropy of the original tokens at the picked positions. A
`classification` run starts from it with `train.init_from=WORKDIR` (tasks/pretrained_encoder.py).

Model: `models/masked_lm.MaskedLM` over the tokenizer's vocabulary plus one [MASK] id
(`mask_id` = the tokenizer's vocabulary size). Training masks with the step's key,
evaluation with a fixed one. Sums: `loss_sum` (nats) over `count` picked tokens, `correct`,
`examples`, `aux_objective`; metrics: `loss` per picked token, `token_accuracy`, `tokens`,
`examples`.
"""

import functools

import jax

from longformer_jax.data import classification_tasks, token_masking
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.masked_lm import MaskedLM
from longformer_jax.tasks.base import ExampleTask, token_metrics, token_sums

# The step's dropout key is folded with this before masking (data/token_masking.py).
masking_key = functools.partial(token_masking.masking_key, salt=0x4D4C4D31)


def maskable_tokens(batch: dict, cls_token: bool) -> jax.Array:
  """`[b, L]` bool: the content tokens (not padding, not the leading [CLS])."""
  maskable = batch['input_mask'].astype(bool)
  if cls_token:
    maskable = maskable.at[:, 0].set(False)
  return maskable


def masked_token_sums(model, variables, batch: dict, rngs: dict, deterministic: bool, *,
                      masking, cls_token: bool, vocab_size: int) -> dict:
  """Sums of `batch` (`inputs [b, L]`, `input_mask`, `global_flags`, `weight [b]`) over the
  picked tokens of its real examples; `masking`: `config.data.masking`; `vocab_size`: the
  tokenizer's (the [MASK] id)."""
  tokens = batch['inputs']
  masked, picked = token_masking.mask_tokens(
      masking_key(rngs), tokens, maskable_tokens(batch, cls_token), rate=masking.rate,
      replace_mask=masking.replace_mask, replace_random=masking.replace_random,
      mask_id=vocab_size, vocab_size=vocab_size)
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  logits, aux = variables.apply(model, masked, ctx, rngs=rngs)
  weight = batch['weight']
  return token_sums(model, logits, aux, tokens, picked * weight[:, None], weight)


class MaskedPretrainingTask(ExampleTask):
  name = 'masked_pretraining'
  data_module = classification_tasks
  model_class = MaskedLM
  data_keys = classification_tasks.DATA_KEYS + ('masking',)
  columns = (('token_accuracy', 'masked token accuracy'),)

  def check_data(self, data) -> None:
    classification_tasks.check_examples_fit(data)   # the same examples, checked the same way

  def model(self, config, vocab_size: int):
    """`(model_config, model)`: vocabulary = the tokenizer's + [MASK]."""
    return super().model(config, vocab_size + 1)

  def sums_fn(self, config, model):
    vocab_size = self.tokenizer(config.data).vocab_size
    return functools.partial(masked_token_sums, model, masking=config.data.masking,
                             cls_token=config.data.cls_token, vocab_size=vocab_size)

  def metrics(self, totals: dict) -> dict:
    return token_metrics(super().metrics(totals), totals)


TASK = MaskedPretrainingTask()

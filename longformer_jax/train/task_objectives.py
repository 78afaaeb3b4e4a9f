"""Losses and metrics of the encoder tasks: classification, extractive QA, seq2seq (LED).

Each `*_sums(model, params, batch, rngs, deterministic)` returns float32 scalar
sums over the batch's real examples (`batch['weight']` is 0 on padding rows
of evaluation batches): `loss_sum` and its normaliser `count` (examples, or
target tokens for seq2seq), `aux_objective` (the model's weighted auxiliary
losses, `lm_objective.weighted_aux_losses`) and the metric sums. The train
objective is `loss_sum / count + aux_objective`.

Metric sums: classification accuracy; QA span F1 and exact match over token
positions (the predicted span is the best `start <= end < start +
max_answer_len` inside the context, SQuAD-style; F1 is the overlap of the
predicted and gold token sets); seq2seq per-token loss and accuracy. The
metrics of a whole split are `evaluation/task_metrics.task_metrics(sums)`.
"""

import jax
import jax.numpy as jnp
import optax

from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import decoder_context
from longformer_jax.train.lm_objective import weighted_aux_losses

NEG_INF = -1e9


def aux_weights(model) -> dict:
  return model.config.aux_loss_weights


def classification_sums(model, params, batch: dict, rngs: dict, deterministic: bool) -> dict:
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  logits, aux = model.apply({'params': params}, batch['inputs'], ctx, rngs=rngs)
  weight = batch['weight']
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
  correct = (jnp.argmax(logits, axis=-1) == batch['label']).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, aux_weights(model))
  return {'loss_sum': jnp.sum(nll * weight), 'count': jnp.sum(weight),
          'aux_objective': aux_objective, 'correct': jnp.sum(correct * weight)}


def best_spans(start_logits: jax.Array, end_logits: jax.Array, allowed: jax.Array,
               max_answer_len: int) -> tuple[jax.Array, jax.Array]:
  """Argmax over spans of `start[s] + end[e]` with `s <= e < s + max_answer_len`, both allowed.

  O(length * max_answer_len): for each end e and width k, the start is e - k.
  Args: `[batch, length]` logits and bool `allowed`. Returns `(start, end)` int32 `[batch]`.
  """
  start_logits = jnp.where(allowed, start_logits, NEG_INF)
  end_logits = jnp.where(allowed, end_logits, NEG_INF)
  length = start_logits.shape[1]
  widths = jnp.arange(max_answer_len)
  # start_at[b, e, k] = start_logits[b, e - k] (NEG_INF before the sequence).
  index = jnp.arange(length)[:, None] - widths[None, :]
  start_at = jnp.where(index >= 0, start_logits[:, jnp.clip(index, 0, length - 1)], NEG_INF)
  scores = start_at + end_logits[:, :, None]                     # [b, e, k]
  flat = jnp.argmax(scores.reshape(scores.shape[0], -1), axis=-1)
  end, width = jnp.divmod(flat, max_answer_len)
  return (end - width).astype(jnp.int32), end.astype(jnp.int32)


def span_f1(pred_start, pred_end, gold_start, gold_end) -> jax.Array:
  """F1 of the token sets [pred_start, pred_end] and [gold_start, gold_end] (inclusive)."""
  overlap = jnp.maximum(0, jnp.minimum(pred_end, gold_end) - jnp.maximum(pred_start, gold_start) + 1)
  precision = overlap / jnp.maximum(pred_end - pred_start + 1, 1)
  recall = overlap / jnp.maximum(gold_end - gold_start + 1, 1)
  return jnp.where(overlap > 0, 2 * precision * recall / jnp.maximum(precision + recall, 1e-9), 0.0)


def qa_sums(model, params, batch: dict, rngs: dict, deterministic: bool,
            max_answer_len: int = 30) -> dict:
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  start_logits, end_logits, aux = model.apply({'params': params}, batch['inputs'], ctx, rngs=rngs)
  allowed = batch['answer_mask']
  masked = lambda logits: jnp.where(allowed, logits, NEG_INF)
  nll = 0.5 * (optax.softmax_cross_entropy_with_integer_labels(masked(start_logits),
                                                               batch['answer_start'])
               + optax.softmax_cross_entropy_with_integer_labels(masked(end_logits),
                                                                 batch['answer_end']))
  start, end = best_spans(start_logits, end_logits, allowed, max_answer_len)
  f1 = span_f1(start, end, batch['answer_start'], batch['answer_end'])
  exact = ((start == batch['answer_start']) & (end == batch['answer_end'])).astype(jnp.float32)
  weight = batch['weight']
  aux_objective, _ = weighted_aux_losses(aux, aux_weights(model))
  return {'loss_sum': jnp.sum(nll * weight), 'count': jnp.sum(weight),
          'aux_objective': aux_objective, 'f1_sum': jnp.sum(f1 * weight),
          'exact_sum': jnp.sum(exact * weight)}


def seq2seq_sums(model, params, batch: dict, rngs: dict, deterministic: bool) -> dict:
  source_ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  target_ctx = decoder_context(batch['decoder_mask'], deterministic)
  logits, aux = model.apply({'params': params}, batch['inputs'], source_ctx,
                            batch['decoder_inputs'], target_ctx, rngs=rngs)
  mask = batch['decoder_mask'].astype(jnp.float32) * batch['weight'][:, None]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch['decoder_targets'])
  correct = (jnp.argmax(logits, axis=-1) == batch['decoder_targets']).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, aux_weights(model))
  return {'loss_sum': jnp.sum(nll * mask), 'count': jnp.sum(mask),
          'aux_objective': aux_objective, 'correct': jnp.sum(correct * mask),
          'examples': jnp.sum(batch['weight'])}


TASK_SUMS = {
    'classification': classification_sums,
    'qa': qa_sums,
    'seq2seq': seq2seq_sums,
}


"""Task `qa` (Longformer, sec. 6.1): extractive question answering, a span of the context.

Data: `data/qa_tasks.py`, `[CLS] question [SEP] context`; the question's
tokens are global (`data.question_len + 2` global tokens). Model:
`models/encoder.SpanExtractor` (start and end logits). The predicted span is
the best `start <= end < start + data.max_answer_len` inside the context,
SQuAD-style (`best_spans`); F1 is the overlap of the predicted and gold token
sets (`span_f1`). Sums over the batch's real examples (`weight`): `loss_sum`
(mean of the start and end cross-entropies, nats) over `count` examples,
`f1_sum`, `exact_sum`, `aux_objective`; metrics: `loss`, `span_f1`,
`exact_match`, `examples`. Fine-tunes a Hugging Face Longformer.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from longformer_jax.config.errors import require
from longformer_jax.data import qa_tasks
from longformer_jax.data.data_config import DataConfig
from longformer_jax.models.encoder import SpanExtractor, encoder_context
from longformer_jax.tasks.base import ExampleTask
from longformer_jax.train.lm_objective import weighted_aux_losses

NEG_INF = -1e9


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


def qa_sums(model, variables, batch: dict, rngs: dict, deterministic: bool,
            max_answer_len: int = 30) -> dict:
  """Sums of `batch` (`inputs [b, L]`, `input_mask`, `global_flags`, `answer_mask [b, L]`,
  `answer_start [b]`, `answer_end [b]`, `weight [b]`)."""
  ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  start_logits, end_logits, aux = variables.apply(model, batch['inputs'], ctx, rngs=rngs)
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
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(nll * weight), 'count': jnp.sum(weight),
          'aux_objective': aux_objective, 'f1_sum': jnp.sum(f1 * weight),
          'exact_sum': jnp.sum(exact * weight)}


class QaTask(ExampleTask):
  name = 'qa'
  hf_checkpoint = 'encoder'
  data_module = qa_tasks
  model_class = SpanExtractor
  data_keys = ('seq_len', 'max_examples', 'tfds_config', 'question_len', 'max_answer_len')
  train_keys = ('eval_max_examples', 'init_from_hf')
  columns = (('span_f1', 'span F1'), ('exact_match', 'exact match'))

  def check_data(self, data) -> None:
    require(data.question_len <= data.seq_len - 3, 'data.question_len',
            f'{data.question_len} must be in [1, seq_len - 3 = {data.seq_len - 3}]')

  def hf_settings(self, data: dict, model: dict, settings: dict) -> None:
    """A fine-tuning config of an imported checkpoint (convert/workdir_cli.py): the default
    question length where it fits in `data.seq_len`, else a quarter of the example."""
    del model, settings
    if DataConfig.question_len > data['seq_len'] - 3:
      data['question_len'] = max(1, data['seq_len'] // 4)

  def global_tokens(self, config) -> int:
    return config.data.question_len + 2

  def sums_fn(self, config, model):
    return functools.partial(qa_sums, model, max_answer_len=config.data.max_answer_len)

  def metrics(self, totals: dict) -> dict:
    metrics = super().metrics(totals)
    count = max(totals['count'], 1.0)
    metrics.update(span_f1=totals['f1_sum'] / count, exact_match=totals['exact_sum'] / count)
    return metrics


TASK = QaTask()

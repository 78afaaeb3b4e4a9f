"""The encoder tasks' metrics from their sums (`train/task_objectives.py`) over a batch or a split.

  classification: loss (nats per example), accuracy
  qa:             loss (nats per example), span_f1, exact_match (token positions, SQuAD-style)
  seq2seq:        loss (nats per target token), token_accuracy, tokens
  image:          loss (nats per dimension), bits_per_dim (loss / ln 2), intensity_accuracy, dims
  sentence_mask:  loss (nats per masked-sentence token), token_accuracy, tokens
  extractive:     loss (binary cross-entropy per sentence), label_accuracy, sentences

plus `examples`, the number of examples scored.
"""

import math


def task_metrics(task: str, totals: dict) -> dict:
  """Metrics from the sums over a batch or a whole evaluation split (floats)."""
  count = max(totals['count'], 1.0)
  metrics = {'loss': totals['loss_sum'] / count,
             'examples': totals['examples'] if 'examples' in totals else totals['count']}
  if task == 'classification':
    metrics['accuracy'] = totals['correct'] / count
  elif task == 'qa':
    metrics.update(span_f1=totals['f1_sum'] / count, exact_match=totals['exact_sum'] / count)
  elif task == 'image':
    metrics.update(bits_per_dim=metrics['loss'] / math.log(2),
                   intensity_accuracy=totals['correct'] / count, dims=totals['count'])
  elif task == 'extractive':
    metrics.update(label_accuracy=totals['correct'] / count, sentences=totals['count'])
  else:
    metrics.update(token_accuracy=totals['correct'] / count, tokens=totals['count'])
  return metrics

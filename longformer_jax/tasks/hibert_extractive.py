"""HIBERT's extractive summarisation (Zhang et al., 2019, sec. 4): oracle labels, loss, ROUGE
(the task: `tasks/extractive.py`).

Oracle labels (sec. 4, as in Nallapati et al., 2017): starting from nothing,
greedily add the sentence that most increases ROUGE-1 F + ROUGE-2 F of the
selection (its sentences joined in document order) against the reference
summary; stop when no sentence increases it. ROUGE is `evaluation/rouge.py`
over `rouge.words` of the text. Only the first `max_sentences` sentences
(those the model sees) are candidates.

Loss: binary cross-entropy of each real sentence's logit against its label,
averaged over sentences; `label_accuracy` counts `logit > 0` == label.

Metric (`selection_rouge`): the `summary_sentences` highest-scoring real
sentences, in document order, joined, against the reference summary:
ROUGE-1/2/L F-measures averaged over documents.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from longformer_jax.evaluation import rouge
from longformer_jax.train.lm_objective import weighted_aux_losses


def _score(selection_words: list, reference_words: list) -> float:
  return (rouge.rouge_n(selection_words, reference_words, 1)
          + rouge.rouge_n(selection_words, reference_words, 2))


def oracle_indices(sentences, summary: str) -> list[int]:
  """The greedy oracle's sentence indices, sorted (see the module docstring)."""
  reference = rouge.words(summary)
  sentence_words = [rouge.words(s) for s in sentences]
  selected, best = [], 0.0
  while True:
    candidates = []
    for i in range(len(sentences)):
      if i not in selected:
        chosen = sorted(selected + [i])
        candidates.append((_score([w for j in chosen for w in sentence_words[j]], reference), i))
    if not candidates:
      break
    score, index = max(candidates, key=lambda c: (c[0], -c[1]))     # ties: the earlier sentence
    if score <= best:
      break
    selected, best = sorted(selected + [index]), score
  return selected


def oracle_labels(documents, max_sentences: int) -> np.ndarray:
  """float32 `[n, max_sentences]`: 1 on each document's oracle sentences."""
  labels = np.zeros((len(documents), max_sentences), np.float32)
  for row, document in enumerate(documents):
    labels[row, oracle_indices(document.sentences[:max_sentences], document.summary)] = 1.0
  return labels


def extractive_sums(model, variables, batch: dict, rngs: dict, deterministic: bool, *,
                    pad_id: int) -> dict:
  """Sums over the batch's real documents: `loss_sum` (BCE, nats) over `count` real sentences,
  `correct` (label hits), `examples`, `aux_objective`."""
  tokens = batch['sentences']
  logits, aux = variables.apply(model, tokens, tokens != pad_id, batch['sentence_mask'],
                                deterministic, rngs=rngs)
  labels = batch['labels']
  mask = batch['sentence_mask'].astype(jnp.float32) * batch['weight'][:, None]
  bce = optax.sigmoid_binary_cross_entropy(logits, labels)
  correct = ((logits > 0) == (labels > 0.5)).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(bce * mask), 'count': jnp.sum(mask), 'aux_objective': aux_objective,
          'correct': jnp.sum(correct * mask), 'examples': jnp.sum(batch['weight'])}


def top_sentences(logits: np.ndarray, sentence_mask: np.ndarray, k: int) -> list[int]:
  """The `k` highest logits among real sentences, in document order (ties: earlier first)."""
  real = np.flatnonzero(sentence_mask)
  order = real[np.argsort(-logits[real], kind='stable')]
  return sorted(order[:k].tolist())


def selection_rouge(model, params, batches, documents, k: int, pad_id: int) -> dict:
  """`rouge1`, `rouge2`, `rougeL` of the top-`k` selections of `documents` (matched by the
  batches' `example_index`; rows of weight 0 are skipped)."""
  @jax.jit
  def predict(params, batch):
    tokens = batch['sentences']
    return model.apply({'params': params}, tokens, tokens != pad_id, batch['sentence_mask'],
                       True)[0]

  pairs = []
  for batch in batches:
    logits = np.asarray(jax.device_get(predict(params, batch)))
    host = {name: np.asarray(jax.device_get(batch[name]))
            for name in ('sentence_mask', 'example_index', 'weight')}
    for row in np.flatnonzero(host['weight'] > 0):
      document = documents[int(host['example_index'][row])]
      chosen = top_sentences(logits[row], host['sentence_mask'][row], k)
      text = ' '.join(document.sentences[i] for i in chosen)
      pairs.append((rouge.words(text), rouge.words(document.summary)))
  return rouge.mean_rouge(pairs)

"""The classification and span-extraction objectives against numpy, on given logits.

The model is replaced by fixed logits (what `variables.apply` returns), so the sums are
those of the formulas alone: softmax cross-entropy of the label over weighted rows, and the
mean of the start and end cross-entropies over the allowed positions (BERT's SQuAD loss,
Devlin et al. 2019, section 4.2). Training on the synthetic tasks is a slow test
(tests/tasks/test_longformer_tasks.py).
"""

import types

import jax
import numpy as np

from longformer_jax.tasks.classification import label_sums
from longformer_jax.tasks.qa import qa_sums


def log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def fake_model(aux_weights=None):
  return types.SimpleNamespace(config=types.SimpleNamespace(aux_loss_weights=aux_weights or {}))


def test_label_sums_are_the_weighted_cross_entropy_and_hits():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 4)).astype(np.float32) * 3
  label = np.array([0, 3, 1, 2, 2])
  weight = np.array([1, 1, 0, 1, 1], np.float32)
  logits[[0, 1, 2], label[:3]] += 8.0     # rows 0-2 right (row 2 not counted), 3-4 by chance
  aux = [{'balance_loss': np.float32(0.5), 'occupancy': np.float32(0.3)}]
  sums = jax.jit(lambda l: label_sums(fake_model({'balance_loss': 0.1}), l, aux,
                                      {'label': label, 'weight': weight}))(logits)
  nll = -log_softmax(logits.astype(np.float64))[np.arange(5), label]
  np.testing.assert_allclose(sums['loss_sum'], (nll * weight).sum(), rtol=1e-5)
  assert float(sums['count']) == 4
  hits = ((logits.argmax(-1) == label) * weight).sum()
  assert hits >= 2 and float(sums['correct']) == hits
  np.testing.assert_allclose(sums['aux_objective'], 0.05, rtol=1e-6)


def test_qa_sums_are_the_mean_start_and_end_cross_entropy_over_allowed_positions():
  rng = np.random.default_rng(1)
  b, length = 3, 12
  start_logits = rng.normal(size=(b, length)).astype(np.float32) * 2
  end_logits = rng.normal(size=(b, length)).astype(np.float32) * 2
  allowed = np.ones((b, length), bool)
  allowed[:, :4] = False                  # the question and [CLS]
  allowed[2, 9:] = False                  # padding
  batch = {'inputs': np.zeros((b, length), np.int32), 'input_mask': np.ones((b, length), bool),
           'global_flags': np.zeros((b, length), bool), 'answer_mask': allowed,
           'answer_start': np.array([4, 6, 5]), 'answer_end': np.array([5, 9, 8]),
           'weight': np.array([1, 1, 1], np.float32)}
  # The best allowed span of row 0 is its answer, exactly; the others are scored by F1.
  start_logits[0, 4], end_logits[0, 5] = 20.0, 20.0
  variables = types.SimpleNamespace(apply=lambda *a, **k: (start_logits, end_logits, []))
  sums = qa_sums(fake_model(), variables, batch, rngs={}, deterministic=True, max_answer_len=4)
  masked = lambda x: np.where(allowed, x.astype(np.float64), -np.inf)
  rows = np.arange(b)
  nll = -0.5 * (log_softmax(masked(start_logits))[rows, batch['answer_start']]
                + log_softmax(masked(end_logits))[rows, batch['answer_end']])
  np.testing.assert_allclose(sums['loss_sum'], nll.sum(), rtol=1e-5)
  assert float(sums['count']) == 3
  # The best allowed span (start <= end < start + 4) by brute force, and its token F1.
  exact = f1 = 0.0
  for r in rows:
    spans = [(s, e) for s in range(length) for e in range(s, min(s + 4, length))
             if allowed[r, s] and allowed[r, e]]
    s, e = max(spans, key=lambda span: start_logits[r, span[0]] + end_logits[r, span[1]])
    gold = set(range(batch['answer_start'][r], batch['answer_end'][r] + 1))
    overlap = len(gold & set(range(s, e + 1)))
    exact += (s, e) == (batch['answer_start'][r], batch['answer_end'][r])
    f1 += 0.0 if not overlap else 2 * overlap / (len(gold) + e - s + 1)
  assert exact >= 1          # row 0
  np.testing.assert_allclose(sums['exact_sum'], exact)
  np.testing.assert_allclose(sums['f1_sum'], f1, rtol=1e-6)

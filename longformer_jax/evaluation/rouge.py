"""ROUGE-1, ROUGE-2 and ROUGE-L F-measures (Lin, 2004), on token ids or words of decoded text.

  ROUGE-N: n-gram overlap, each n-gram counted at most as often as it occurs
           in the other sequence; precision = overlap / prediction n-grams,
           recall = overlap / reference n-grams.
  ROUGE-L: the longest common subsequence (LCS); precision = LCS / prediction
           length, recall = LCS / reference length (sentence-level, as
           `rouge_score` without `rougeLsum`).
  F = 2 P R / (P + R), and 0 when there is no overlap (or a side is empty).

`words(text)` tokenises as the `rouge_score` package does without stemming:
lowercase, every run of characters other than a-z and 0-9 separates words.
"""

import collections
import re
from typing import Hashable, Sequence

ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeL')
_NOT_WORD = re.compile(r'[^a-z0-9]+')


def words(text: str) -> list[str]:
  """Lowercase words of `text`, split at every character outside a-z and 0-9."""
  return _NOT_WORD.sub(' ', text.lower()).split()


def f_measure(overlap: float, predicted: int, reference: int) -> float:
  """F1 of `overlap` items among `predicted` and `reference` items (0 without overlap)."""
  if overlap <= 0:
    return 0.0
  precision, recall = overlap / predicted, overlap / reference
  return 2 * precision * recall / (precision + recall)


def ngram_counts(tokens: Sequence[Hashable], n: int) -> collections.Counter:
  return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def rouge_n(prediction: Sequence[Hashable], reference: Sequence[Hashable], n: int) -> float:
  """ROUGE-N F-measure of two token sequences."""
  predicted, wanted = ngram_counts(prediction, n), ngram_counts(reference, n)
  overlap = sum((predicted & wanted).values())
  return f_measure(overlap, sum(predicted.values()), sum(wanted.values()))


def lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
  """Length of the longest common subsequence of `a` and `b` (O(len a * len b))."""
  previous = [0] * (len(b) + 1)
  for item in a:
    current = [0]
    for j, other in enumerate(b):
      current.append(previous[j] + 1 if item == other else max(previous[j + 1], current[j]))
    previous = current
  return previous[-1]


def rouge_l(prediction: Sequence[Hashable], reference: Sequence[Hashable]) -> float:
  """ROUGE-L F-measure of two token sequences."""
  return f_measure(lcs_length(prediction, reference), len(prediction), len(reference))


def rouge_scores(prediction: Sequence[Hashable], reference: Sequence[Hashable]) -> dict:
  """`{'rouge1', 'rouge2', 'rougeL'}` F-measures of one prediction against its reference."""
  return {'rouge1': rouge_n(prediction, reference, 1), 'rouge2': rouge_n(prediction, reference, 2),
          'rougeL': rouge_l(prediction, reference)}


def mean_rouge(pairs: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]]) -> dict:
  """Each ROUGE F-measure averaged over `(prediction, reference)` pairs."""
  totals = dict.fromkeys(ROUGE_TYPES, 0.0)
  for prediction, reference in pairs:
    for name, value in rouge_scores(prediction, reference).items():
      totals[name] += value
  return {name: value / max(len(pairs), 1) for name, value in totals.items()}

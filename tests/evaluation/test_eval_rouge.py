"""ROUGE-1/2/L F-measures against hand-computed values and, when installed, the rouge-score package."""

import pytest

from longformer_jax.evaluation import rouge


def test_rouge_of_a_reordered_sentence_matches_the_hand_computation():
  prediction = 'the cat the mat sat'.split()
  reference = 'the cat sat on the mat'.split()
  scores = rouge.rouge_scores(prediction, reference)
  # Unigrams: the x2, cat, mat, sat all in the reference: 5 of 5 predicted, 5 of 6 reference.
  assert scores['rouge1'] == pytest.approx(2 * 1.0 * (5 / 6) / (1.0 + 5 / 6))
  # Bigrams: (the cat), (the mat) of 4 predicted and 5 reference bigrams.
  assert scores['rouge2'] == pytest.approx(2 * (2 / 4) * (2 / 5) / (2 / 4 + 2 / 5))
  # LCS: 'the cat the mat' (4 tokens).
  assert scores['rougeL'] == pytest.approx(2 * (4 / 5) * (4 / 6) / (4 / 5 + 4 / 6))


def test_repeated_ngrams_count_at_most_as_often_as_in_the_other_sequence():
  assert rouge.rouge_n(['a', 'a', 'a'], ['a'], 1) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_no_overlap_and_empty_sequences_score_zero():
  assert rouge.rouge_scores([], ['a']) == {'rouge1': 0.0, 'rouge2': 0.0, 'rougeL': 0.0}
  assert rouge.rouge_scores(['b'], ['a']) == {'rouge1': 0.0, 'rouge2': 0.0, 'rougeL': 0.0}
  assert rouge.rouge_scores(['a'], ['a']) == {'rouge1': 1.0, 'rouge2': 0.0, 'rougeL': 1.0}


def test_token_ids_work_like_words():
  assert rouge.rouge_scores([5, 7, 9], [5, 9]) == rouge.rouge_scores(list('acx'), list('ax'))


def test_lcs_length_of_classic_example():
  assert rouge.lcs_length('ABCBDAB', 'BDCABA') == 4


def test_words_split_like_rouge_score():
  assert rouge.words("Hello, World! it's 3x") == ['hello', 'world', 'it', 's', '3x']


def test_mean_rouge_averages_over_pairs():
  pairs = [(['a'], ['a']), (['b'], ['a'])]
  assert rouge.mean_rouge(pairs) == {'rouge1': 0.5, 'rouge2': 0.0, 'rougeL': 0.5}


STRINGS = [
    ('the quick brown fox jumps over the lazy dog', 'the quick brown dog jumps on the log'),
    ('Police killed the gunman.', 'The gunman was shot down by police!'),
    ('a a a b b c', 'a b c a b a c'),
    ('summarise the report in one line', 'one line report summary'),
    ('nothing', 'in common here'),
]


@pytest.mark.parametrize('prediction,reference', STRINGS)
def test_agrees_with_the_rouge_score_package(prediction, reference):
  rouge_scorer = pytest.importorskip('rouge_score.rouge_scorer')
  expected = rouge_scorer.RougeScorer(list(rouge.ROUGE_TYPES)).score(reference, prediction)
  got = rouge.rouge_scores(rouge.words(prediction), rouge.words(reference))
  for name in rouge.ROUGE_TYPES:
    assert got[name] == pytest.approx(expected[name].fmeasure, abs=1e-12), name

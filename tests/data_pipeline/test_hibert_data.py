"""HIBERT data: the sentence splitter, documents, arrays and greedy oracle labels.

References: hand-written splits, a hand-built array, and a plain-Python greedy
oracle with its own n-gram counting (not evaluation/rouge.py).
"""

import collections
import itertools
import re

import ml_collections
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import hibert_documents as hd
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.stdlib_corpus import split_of
from longformer_jax.tasks import hibert_extractive


@pytest.mark.parametrize('text,want', [
    ('One. Two! Three? Four', ['One.', 'Two!', 'Three?', 'Four']),
    ('No end here', ['No end here']),
    ('Version 3.11 is out.  Next\n  line. ', ['Version 3.11 is out.', 'Next line.']),
    ('Para one\nwraps.\n\nPara two', ['Para one wraps.', 'Para two']),
    ('Title line\n   \t\nBody. More.', ['Title line', 'Body.', 'More.']),
    ('e.g. this splits', ['e.g.', 'this splits']),        # the documented simple rule
    ('Ends.\n\n\n', ['Ends.']),
    ('', []),
    ('Why?!  Yes...  ok', ['Why?!', 'Yes...', 'ok']),
])
def test_split_sentences_hand_written_cases(text, want):
  assert hd.split_sentences(text) == want


def test_docstrings_in_source_order_and_unparsable_source():
  source = b'"""Module doc. Two."""\nclass A:\n  """Class doc."""\n  def f(self):\n    """F doc."""\n'
  assert hd.docstrings(source) == [('', 'Module doc. Two.'), ('A', 'Class doc.'), ('f', 'F doc.')]
  assert hd.docstrings(b'def (:\n') == []
  assert hd.docstrings(b'\xff\xfe not python') == []


def test_documents_skip_short_texts_and_take_the_first_sentence_as_summary():
  texts = [('a', 'Summary line.\n\nBody one. Body two.', ''),
           ('b', 'Only one sentence.', ''),
           ('c', 'Summary. Single body.', ''),
           ('d', 'Art one. Art two.', 'Given highlights\nhere')]
  docs, skipped = hd.documents_of_texts(texts, with_summary=True)
  assert skipped == 2 and [d.name for d in docs] == ['a', 'd']
  assert docs[0].summary == 'Summary line.' and docs[0].sentences == ('Body one.', 'Body two.')
  assert docs[1].summary == 'Given highlights here'
  docs, skipped = hd.documents_of_texts(texts, with_summary=False)
  assert skipped == 1 and [d.name for d in docs] == ['a', 'c', 'd']
  assert docs[0].sentences == ('Summary line.', 'Body one.', 'Body two.')


def names_in(split: str, count: int) -> list[str]:
  """`count` file names that `split_of` sends to `split`."""
  return list(itertools.islice((f'doc{i}.txt' for i in itertools.count()
                                if split_of(f'doc{i}.txt') == split), count))


def test_text_files_skip_non_utf8_and_one_sentence_files(tmp_path):
  train = names_in('train', 4)
  (tmp_path / train[0]).write_text('A first. A second. A third.')
  (tmp_path / train[1]).write_bytes(b'Bad \xff bytes. Two.')
  (tmp_path / train[2]).write_text('Just one.')
  (tmp_path / train[3]).write_text('')
  data = ml_collections.ConfigDict({'corpus': str(tmp_path) + '/', 'tfds_data_dir': ''})
  docs = hd.load_documents(data, 'train', with_summary=False)
  assert [d.name for d in docs] == [train[0]]
  docs = hd.load_documents(data, 'train', with_summary=True)
  assert docs[0].summary == 'A first.' and docs[0].sentences == ('A second.', 'A third.')
  (tmp_path / train[0]).write_text('Now a single sentence.')
  with pytest.raises(ConfigError) as error:
    hd.load_documents(data, 'train', with_summary=False)
  assert error.value.key == 'data.corpus' and '\n' not in str(error.value)


def test_unknown_corpus_names_the_key():
  data = ml_collections.ConfigDict({'corpus': 'pg19', 'tfds_data_dir': ''})
  with pytest.raises(ConfigError) as error:
    hd.load_documents(data, 'train', with_summary=False)
  assert error.value.key == 'data.corpus'


def test_cnn_dailymail_needs_prepared_data():
  data = ml_collections.ConfigDict({'corpus': 'cnn_dailymail', 'tfds_data_dir': '',
                                    'tfds_cache_dir': DataConfig.tfds_cache_dir})
  with pytest.raises(ConfigError) as error:
    hd.load_documents(data, 'train', with_summary=True)
  assert error.value.key == 'data.tfds_data_dir'


def test_sentence_arrays_against_a_hand_built_example():
  tok = ByteTokenizer()
  docs = [hd.SentenceDocument('x', ('ab.', 'cdefg.', 'h.')), hd.SentenceDocument('y', ('z.', 'w.'))]
  arrays = hd.sentence_arrays(docs, tok, max_sentences=2, max_sentence_tokens=4)
  P, B, E = tok.pad_id, tok.bos_id, tok.eos_id
  a, b, c, d, e, f = (ord(ch) for ch in 'abcdef')
  dot = ord('.')
  np.testing.assert_array_equal(arrays['sentences'][0], [[B, a, b, dot], [B, c, d, e]])
  np.testing.assert_array_equal(arrays['targets'][0], [[a, b, dot, E], [c, d, e, E]])
  np.testing.assert_array_equal(arrays['sentences'][1], [[B, ord('z'), dot, P],
                                                         [B, ord('w'), dot, P]])
  np.testing.assert_array_equal(arrays['targets'][1], [[ord('z'), dot, E, P], [ord('w'), dot, E, P]])
  np.testing.assert_array_equal(arrays['sentence_mask'], [[True, True], [True, True]])
  arrays = hd.sentence_arrays(docs[1:], tok, max_sentences=3, max_sentence_tokens=4)
  np.testing.assert_array_equal(arrays['sentence_mask'], [[True, True, False]])
  assert (arrays['sentences'][0, 2] == P).all() and (arrays['targets'][0, 2] == P).all()
  np.testing.assert_array_equal(arrays['example_index'], [0])


# ---- oracle labels against a plain-Python greedy reference --------------------------------

def ref_words(text):
  return re.findall(r'[a-z0-9]+', text.lower())


def ref_f(pred, ref, n):
  grams = lambda ws: collections.Counter(tuple(ws[i:i + n]) for i in range(len(ws) - n + 1))
  p, r = grams(pred), grams(ref)
  overlap = sum(min(count, r[g]) for g, count in p.items())
  if not overlap:
    return 0.0
  precision, recall = overlap / sum(p.values()), overlap / sum(r.values())
  return 2 * precision * recall / (precision + recall)


def ref_oracle(sentences, summary):
  reference = ref_words(summary)
  chosen, best = set(), 0.0
  while True:
    scores = {}
    for i in range(len(sentences)):
      if i in chosen:
        continue
      selection = [w for j in sorted(chosen | {i}) for w in ref_words(sentences[j])]
      scores[i] = ref_f(selection, reference, 1) + ref_f(selection, reference, 2)
    if not scores:
      return sorted(chosen)
    top = max(scores.values())
    if top <= best:
      return sorted(chosen)
    chosen.add(min(i for i, v in scores.items() if v == top))
    best = top


def test_oracle_equals_the_plain_python_greedy_on_random_documents():
  rng = np.random.default_rng(0)
  vocab = [f'w{i}' for i in range(12)]
  for _ in range(60):
    n = int(rng.integers(1, 8))
    sentences = [' '.join(rng.choice(vocab, int(rng.integers(1, 7)))) + '.' for _ in range(n)]
    summary = ' '.join(rng.choice(vocab, int(rng.integers(1, 9))))
    assert hibert_extractive.oracle_indices(sentences, summary) == ref_oracle(sentences, summary)


def test_oracle_hand_case_and_labels_array():
  sentences = ['The cat sat.', 'Dogs bark loudly.', 'The cat sat on the mat.', 'Rain.']
  assert hibert_extractive.oracle_indices(sentences, 'the cat sat on the mat') == [2]
  assert hibert_extractive.oracle_indices(sentences, 'rain dogs bark') == [1, 3]
  assert hibert_extractive.oracle_indices(sentences, 'nothing matches') == []
  docs = [hd.SentenceDocument('a', tuple(sentences), 'rain dogs bark')]
  labels = hibert_extractive.oracle_labels(docs, max_sentences=3)   # 'Rain.' is cut off
  np.testing.assert_array_equal(labels, [[0, 1, 0]])


def test_top_sentences_in_document_order():
  logits = np.array([0.5, 3.0, -1.0, 2.0, 9.0])
  mask = np.array([True, True, True, True, False])
  assert hibert_extractive.top_sentences(logits, mask, 3) == [0, 1, 3]
  assert hibert_extractive.top_sentences(logits, mask, 9) == [0, 1, 2, 3]

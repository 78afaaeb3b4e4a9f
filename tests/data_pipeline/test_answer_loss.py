"""`data.loss_on='answer'`: the training loss counts the answers of passkey / attendre_qa alone.

Held to a reference built by plain concatenation (as tests/data_pipeline/test_data_train_streams.py
builds the streams): each document is written [BOS] + prompt + answer, and a target counts
exactly when it is a token of an answer.
"""

import numpy as np
import pytest

import train as train_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import attendre_qa, passkey
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.corpus import tokenize_answered_documents, tokenize_documents
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.document import Document
from longformer_jax.data.train_streams import TrainStreams
from tests.support.tiny_models import tiny_config

BOS = 1


def reference_counted_targets(docs, starts, num_rows, seed, num_targets):
  """Per row, whether each of its first `num_targets` targets (stream tokens 1, 2, ...) is an
  answer token, by concatenating [False] + [i >= start for each token i] per document."""
  flags = [[] for _ in range(num_rows)]
  epoch = 0
  while min(len(f) for f in flags) < num_targets + 1:
    order = np.random.default_rng([seed, epoch]).permutation(len(docs))
    for row in range(num_rows):
      for doc_id in order[row::num_rows]:
        flags[row].append(False)
        flags[row].extend(i >= starts[doc_id] for i in range(docs[doc_id].size))
    epoch += 1
  return np.array([f[1:num_targets + 1] for f in flags])


@pytest.mark.parametrize('num_rows,tokens_per_step', [(1, 5), (3, 4), (2, 32)])
def test_only_answer_tokens_count_as_targets(num_rows, tokens_per_step):
  rng = np.random.default_rng(tokens_per_step)
  docs = [rng.integers(2, 200, size=n).astype(np.int32) for n in rng.integers(2, 12, size=7)]
  starts = [int(rng.integers(1, d.size)) for d in docs]
  streams = TrainStreams(docs, num_rows, tokens_per_step, seed=5, bos_id=BOS,
                         answer_starts=starts)
  num_steps = 9
  masks = np.concatenate([streams.next_batch().target_mask for _ in range(num_steps)], axis=1)
  reference = reference_counted_targets(docs, starts, num_rows, 5, num_steps * tokens_per_step)
  np.testing.assert_array_equal(masks, reference)
  assert 0 < masks.sum() < masks.size


def test_without_answer_starts_every_target_counts():
  docs = [np.full([n], 7, np.int32) for n in (3, 5, 2)]
  streams = TrainStreams(docs, 1, 6, seed=0, bos_id=BOS)
  assert all(streams.next_batch().target_mask.all() for _ in range(4))


def test_answer_starts_must_match_the_documents():
  with pytest.raises(ValueError, match='2 answer starts for 3 documents'):
    TrainStreams([np.ones([4], np.int32)] * 3, 1, 4, seed=0, bos_id=BOS, answer_starts=[1, 2])


@pytest.mark.parametrize('load', [
    lambda: passkey.load_documents('valid', 300),
    lambda: attendre_qa.load_documents('valid', 300),
])
def test_the_corpora_mark_where_their_answers_start(load):
  documents = load()
  for document in documents[:20]:
    text = document.data.decode('ascii')
    prompt, answer = text[:document.answer_start], text[document.answer_start:]
    assert prompt.rstrip().endswith(('is', 'Answer:')), prompt[-30:]
    assert answer.endswith('.') and answer[:-1].strip() and '\n' not in answer
  tokenizer = ByteTokenizer()
  tokens, starts = tokenize_answered_documents(tokenizer, documents)
  for whole, split, start, document in zip(tokenize_documents(tokenizer, documents), tokens,
                                           starts, documents):
    np.testing.assert_array_equal(split, whole)       # bytes: the same tokens
    assert start == document.answer_start


def test_a_document_without_an_answer_is_named():
  with pytest.raises(ValueError, match="document 'notes.txt' has no answer"):
    tokenize_answered_documents(ByteTokenizer(), [Document('notes.txt', b'plain text')])


def test_loss_on_answers_needs_an_answered_corpus():
  DataConfig.build(dict(corpus='attendre_qa', loss_on='answer'), 'config.data')
  with pytest.raises(ConfigError, match='config.data.loss_on'):
    DataConfig.build(dict(corpus='stdlib', loss_on='answer'), 'config.data')
  with pytest.raises(ConfigError, match='config.data.loss_on'):
    DataConfig.build(dict(corpus='passkey', loss_on='answers'), 'config.data')


def test_a_training_step_counts_the_answer_tokens_alone(tmp_path):
  config = tiny_config(attention='vanilla', mem_len=0)
  config.data.update(corpus='passkey', chunk_len=128, chunks_per_step=1, loss_on='answer')
  config.train.update(num_steps=1, checkpoint_every=1)
  _, metrics = train_script.train(config, str(tmp_path))
  documents = passkey.load_documents('train', 127)
  docs, starts = tokenize_answered_documents(ByteTokenizer(), documents)
  counted = reference_counted_targets(docs, starts, config.data.batch_size, config.seed, 128)
  assert 0 < metrics['tokens'] == counted.sum() < counted.size
  assert np.isfinite(metrics['loss'])

"""Tests of corpus and tokenizer dispatch and of document tokenization."""

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import corpus, tokenizers
from longformer_jax.data import stdlib_corpus
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.document import Document
from longformer_jax.data.sentencepiece_tokenizer import SentencePieceTokenizer
from longformer_jax.data.sentencepiece_tokenizer import train_sentencepiece
from tests.support.data_configs import data_config


@pytest.fixture(scope='module')
def sentencepiece_model(tmp_path_factory):
  rng = np.random.default_rng(0)
  letters = list('abcdefghijklmnopqrstuvwxyz')
  lines = [' '.join(''.join(rng.choice(letters, size=rng.integers(1, 8)))
                    for _ in range(10)) for _ in range(200)]
  text = '\n'.join(lines).encode('utf-8')
  prefix = tmp_path_factory.mktemp('spm') / 'm'
  return train_sentencepiece([text], str(prefix), vocab_size=300,
                             num_threads=1)


def test_default_config_loads_the_stdlib_corpus():
  documents = corpus.load_corpus(data_config(), 'valid')
  assert [d.name for d in documents] == stdlib_corpus.list_documents('valid')


def test_unknown_corpus():
  with pytest.raises(ConfigError, match='wikitext') as error:
    corpus.load_corpus(data_config(corpus='wikitext'), 'train')
  assert error.value.key == 'data.corpus'
  assert './wikitext' in str(error.value)  # Says how to name a directory.


def test_a_corpus_with_a_slash_is_a_directory_of_text_files(tmp_path):
  names = [f'doc_{i}.txt' for i in range(300)]  # Each split gets some.
  for name in names:
    (tmp_path / name).write_text(f'text of {name}')
  config = data_config(corpus=str(tmp_path))
  loaded = [d.name for split in ('train', 'valid', 'test')
            for d in corpus.load_corpus(config, split)]
  assert sorted(loaded) == sorted(names)
  train = corpus.load_corpus(data_config(corpus=f'{tmp_path}/doc_2?.txt'), 'train')
  assert {d.name for d in train} == {
      f'doc_2{i}.txt' for i in range(10)} & {d.name for d in corpus.load_corpus(config, 'train')}
  with pytest.raises(ConfigError, match='missing') as error:
    corpus.load_corpus(data_config(corpus=f'{tmp_path}/missing'), 'train')
  assert error.value.key == 'data.corpus'


def test_tfds_corpus_without_data_dir():
  with pytest.raises(ConfigError) as error:
    corpus.load_corpus(data_config(corpus='pg19'), 'train')
  assert error.value.key == 'data.tfds_data_dir'


def test_make_tokenizer(sentencepiece_model):
  assert isinstance(tokenizers.make_tokenizer(data_config()), ByteTokenizer)
  tokenizer = tokenizers.make_tokenizer(data_config(
      tokenizer='sentencepiece', sentencepiece_model=sentencepiece_model))
  assert isinstance(tokenizer, SentencePieceTokenizer)
  assert tokenizer.vocab_size == 300


def test_make_tokenizer_errors(tmp_path):
  with pytest.raises(ConfigError) as error:
    tokenizers.make_tokenizer(data_config(tokenizer='wordpiece'))
  assert error.value.key == 'data.tokenizer'
  with pytest.raises(ConfigError) as error:
    tokenizers.make_tokenizer(data_config(tokenizer='sentencepiece'))
  assert error.value.key == 'data.sentencepiece_model'
  missing = str(tmp_path / 'missing.model')
  with pytest.raises(ConfigError, match='missing.model'):
    tokenizers.make_tokenizer(data_config(tokenizer='sentencepiece',
                                      sentencepiece_model=missing))


def test_tokenize_documents_with_bytes():
  documents = [Document('a.py', b'x = 1\n'), Document('b.bin', b'\xff\x00')]
  tokens = corpus.tokenize_documents(ByteTokenizer(), documents)
  assert [t.tolist() for t in tokens] == [list(b'x = 1\n'), [255, 0]]
  assert all(t.dtype == np.int32 for t in tokens)


def test_tokenize_documents_names_a_non_utf8_document(sentencepiece_model):
  tokenizer = SentencePieceTokenizer.load(sentencepiece_model)
  documents = [Document('good.txt', b'one two'),
               Document('test/encoded_modules/koi8.py', b'\xd4\xc5\xd3\xd4')]
  with pytest.raises(ValueError,
                     match="'test/encoded_modules/koi8.py'.*UTF-8"):
    corpus.tokenize_documents(tokenizer, documents)


def test_tokenize_documents_names_an_empty_document():
  documents = [Document('full.txt', b'abc'), Document('empty.txt', b'')]
  with pytest.raises(ValueError, match="'empty.txt' is empty"):
    corpus.tokenize_documents(ByteTokenizer(), documents)


def test_skip_undecodable_drops_only_the_bad_document(sentencepiece_model):
  tokenizer = SentencePieceTokenizer.load(sentencepiece_model)
  docs = [Document('good.py', b'abc def'), Document('latin1.py', b'caf\xe9'),
          Document('also_good.py', b'ghi')]
  with pytest.raises(ValueError, match='latin1.py.*skip_undecodable'):
    corpus.tokenize_documents(tokenizer, docs)
  kept = corpus.tokenize_documents(tokenizer, docs, skip_undecodable=True)
  assert [tokenizer.decode(t) for t in kept] == ['abc def', 'ghi']


def test_cut_into_pieces_covers_every_token_in_order():
  docs = [np.arange(10, dtype=np.int32), np.arange(100, 103, dtype=np.int32)]
  pieces = corpus.cut_into_pieces(docs, 5)
  assert len(pieces) >= 5
  np.testing.assert_array_equal(np.concatenate(pieces), np.concatenate(docs))
  assert corpus.cut_into_pieces(docs, 2) == docs          # enough already: unchanged
  with pytest.raises(ValueError, match='cannot be cut'):
    corpus.cut_into_pieces([np.arange(2)], 3)

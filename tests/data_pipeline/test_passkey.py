"""Passkey documents (data/passkey.py) and the `passkey` corpus.

Independent checks: the length is counted on the tokens, the needle is found
by searching the decoded text, the key is read back with a regular
expression, and a tokenizer of two bytes per token keeps lengths exact.
"""

import re

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import passkey
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.corpus import load_corpus, tokenize_documents
from longformer_jax.data.data_config import DataConfig
from tests.support.passkey_data_config import passkey_data

KEY_PATTERN = re.compile(r'The pass key is (\d{5})\. Remember it\. (\d{5}) is the pass key\.')


def text_of(document) -> str:
  return document.tokens.astype(np.uint8).tobytes().decode('utf-8')


def pair_encode(text: str) -> np.ndarray:
  """A toy tokenizer: two bytes per token (an odd last byte alone)."""
  data = np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32)
  pairs = data[:data.size // 2 * 2].reshape(-1, 2)
  tokens = pairs[:, 0] * 256 + pairs[:, 1]
  return np.concatenate([tokens, data[data.size // 2 * 2:] + 65536]).astype(np.int32)


@pytest.mark.parametrize('length', [105, 106, 128, 255, 1000, 4096])
@pytest.mark.parametrize('depth', [0.0, 0.25, 0.5, 0.999, 1.0])
def test_length_is_exact_and_key_sits_at_its_depth(length, depth):
  key = '54321'
  document = passkey.passkey_document(length, depth, key)
  text = text_of(document)
  assert document.tokens.size == len(text.encode()) == length
  filler = length - passkey.fixed_tokens(key)
  needle = passkey.NEEDLE.format(key=key)
  assert text.find(needle) == document.needle_start == round(depth * filler)
  assert text.endswith(passkey.QUESTION + key + '.')
  found = KEY_PATTERN.search(text)
  assert found and found.group(1) == found.group(2) == key
  assert document.answer.astype(np.uint8).tobytes().decode() == key
  # The filler around the needle is the repeated sentences, cut and continued.
  assert text[:document.needle_start] + text[document.needle_start + len(needle):].split(
      passkey.QUESTION)[0] == (passkey.FILLER * (filler // len(passkey.FILLER) + 1))[:filler]


def test_byte_tokenizer_gives_the_same_tokens():
  tokenizer = ByteTokenizer()
  a = passkey.seeded_document(3, 300, 0.5, 7, tokenizer.encode)
  b = passkey.seeded_document(3, 300, 0.5, 7)
  np.testing.assert_array_equal(a.tokens, b.tokens)


@pytest.mark.parametrize('length', [60, 61, 200, 777])
def test_length_is_exact_in_the_tokens_of_any_tokenizer(length):
  document = passkey.passkey_document(length, 0.4, '12345', pair_encode)
  assert document.tokens.size == length
  assert document.answer_len == 3                       # '12', '34', '5'
  np.testing.assert_array_equal(document.answer, pair_encode('12345'))
  assert document.answer_start + document.answer_len == length - 1    # then '.'


def test_documents_are_deterministic_in_their_seed():
  first = passkey.seeded_document(0, 512, 0.25, 3)
  again = passkey.seeded_document(0, 512, 0.25, 3)
  np.testing.assert_array_equal(first.tokens, again.tokens)
  keys = {passkey.seeded_document(0, 512, 0.25, i).key for i in range(20)}
  assert len(keys) > 15 and all(len(k) == 5 and k[0] != '0' for k in keys)
  assert passkey.seeded_document(1, 512, 0.25, 3).key != first.key or \
      passkey.seeded_document(2, 512, 0.25, 3).key != first.key


def test_bad_lengths_and_depths_are_refused():
  with pytest.raises(ValueError, match='at least 105'):
    passkey.passkey_document(104, 0.5, '12345')
  with pytest.raises(ValueError, match='depth'):
    passkey.passkey_document(300, 1.5, '12345')
  assert passkey.minimum_length() == 105


def test_corpus_documents_fit_a_chunk_and_hold_a_key():
  documents = load_corpus(passkey_data(128), 'valid')
  assert len(documents) == passkey.SPLIT_SIZES['valid']
  tokens = tokenize_documents(ByteTokenizer(), documents)
  lengths = [t.size for t in tokens]
  assert min(lengths) >= passkey.minimum_length() and max(lengths) <= 127
  assert len(set(lengths)) > 10
  for document in documents:
    text = document.data.decode()
    found = KEY_PATTERN.search(text)
    assert found and text.endswith(f'The pass key is {found.group(1)}.')
  again = load_corpus(passkey_data(128), 'valid')
  assert [d.data for d in again] == [d.data for d in documents]
  test = load_corpus(passkey_data(128), 'test')
  assert {d.data for d in test}.isdisjoint(d.data for d in documents)


def test_long_documents_log_uniform_lengths_span_every_octave():
  """data.passkey_*: documents of 256-2,048 tokens, as many per octave (log-uniform)."""
  documents = load_corpus(passkey_data(128, passkey_min_length=256, passkey_max_length=2048,
                                       passkey_lengths='log_uniform'), 'valid')
  lengths = np.array([t.size for t in tokenize_documents(ByteTokenizer(), documents)])
  assert lengths.min() >= 256 and lengths.max() <= 2048
  per_octave = [np.sum((lengths >= lo) & (lengths < 2 * lo)) for lo in (256, 512, 1024)]
  assert min(per_octave) >= 0.25 * len(lengths)       # about 1/3 each
  uniform = load_corpus(passkey_data(128, passkey_min_length=256, passkey_max_length=2048),
                        'valid')
  uniform_lengths = np.array([len(d.data) for d in uniform])
  assert np.sum(uniform_lengths < 512) < 0.25 * len(uniform_lengths)   # about 1/7
  for document in documents:
    found = KEY_PATTERN.search(document.data.decode())
    assert found and document.data.decode().endswith(f'The pass key is {found.group(1)}.')


def test_corpus_errors_name_the_key():
  with pytest.raises(ConfigError, match='config.data.chunk_len'):
    load_corpus(passkey_data(64), 'train')
  with pytest.raises(ConfigError, match='config.eval.split'):
    load_corpus(passkey_data(128), 'dev')
  with pytest.raises(ConfigError, match='config.data.passkey_max_length'):
    load_corpus(passkey_data(128, passkey_max_length=64), 'train')
  with pytest.raises(ConfigError, match='config.data.passkey_min_length'):
    passkey_data(128, passkey_min_length=300)
  with pytest.raises(ConfigError, match='config.data.passkey_max_length.*read only'):
    DataConfig.build(dict(corpus='stdlib', passkey_max_length=512), 'config.data')

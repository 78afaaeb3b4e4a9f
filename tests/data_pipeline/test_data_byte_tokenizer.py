"""Tests of the byte-level tokenizer."""

import numpy as np

from longformer_jax.data.byte_tokenizer import ByteTokenizer


def test_ids_and_vocab():
  tokenizer = ByteTokenizer()
  assert tokenizer.pad_id == 256
  assert tokenizer.bos_id == 257
  assert tokenizer.eos_id == 258
  assert tokenizer.vocab_size == 259


def test_encode_bytes_and_str():
  tokenizer = ByteTokenizer()
  ids = tokenizer.encode(b'ab\x00\xff')
  assert ids.dtype == np.int32
  assert ids.tolist() == [97, 98, 0, 255]
  assert tokenizer.encode('é').tolist() == [0xC3, 0xA9]
  assert tokenizer.encode(b'').shape == (0,)


def test_round_trip_of_any_bytes():
  tokenizer = ByteTokenizer()
  data = bytes(range(256)) + b'\x80\xfe not utf-8'
  assert tokenizer.decode_bytes(tokenizer.encode(data)) == data
  text = 'héllo wörld\n\t中文'
  assert tokenizer.decode(tokenizer.encode(text)) == text


def test_decode_drops_specials_and_replaces_invalid_utf8():
  tokenizer = ByteTokenizer()
  ids = [257, 104, 105, 256, 258, 0xFF, 300, -1]
  assert tokenizer.decode(ids) == 'hi\ufffd'


def test_token_byte_lengths():
  tokenizer = ByteTokenizer()
  lengths = tokenizer.token_byte_lengths()
  assert lengths.shape == (259,) and lengths.dtype == np.int32
  assert lengths[:256].tolist() == [1] * 256
  assert lengths[256:].tolist() == [0, 0, 0]
  text = 'bits per byte: ü'
  assert lengths[tokenizer.encode(text)].sum() == len(text.encode('utf-8'))

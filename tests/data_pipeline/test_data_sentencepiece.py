"""Tests of the SentencePiece tokenizer: training, loading, encoding, errors."""

import subprocess
import sys

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import sentencepiece_tokenizer
from longformer_jax.data.document import Document
from longformer_jax.data.sentencepiece_tokenizer import SentencePieceTokenizer
from longformer_jax.data.sentencepiece_tokenizer import train_sentencepiece
from longformer_jax.storage import paths
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.repo_paths import REPO_ROOT

WORDS = ('the', 'quick', 'brown', 'fox', 'jumps', 'over', 'lazy', 'dog',
         'and', 'then', 'sleeps', 'under', 'a', 'tree')


def small_documents(num_documents=40, seed=0) -> list[bytes]:
  rng = np.random.default_rng(seed)
  documents = []
  for _ in range(num_documents):
    lines = [' '.join(rng.choice(WORDS, size=8)) + '.'
             for _ in range(int(rng.integers(2, 6)))]
    documents.append('\n'.join(lines).encode('utf-8'))
  return documents


@pytest.fixture(scope='module')
def model_path(tmp_path_factory):
  prefix = tmp_path_factory.mktemp('spm') / 'tiny'
  return train_sentencepiece(small_documents(), str(prefix), vocab_size=300,
                             num_threads=1)


def test_trained_model_ids(model_path):
  assert model_path.endswith('.model')
  tokenizer = SentencePieceTokenizer.load(model_path)
  assert tokenizer.vocab_size == 300
  assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 2, 3)


def test_a_gs_model_loads_as_the_local_file(model_path, gcs_bucket):
  remote = f'{gcs_bucket}/tokenizers/tiny.model'
  with open(model_path, 'rb') as f:
    paths.as_path(remote).write_bytes(f.read())
  local, on_gcs = SentencePieceTokenizer.load(model_path), SentencePieceTokenizer.load(remote)
  text = 'the lazy dog sleeps under a tree.'
  assert on_gcs.encode(text).tolist() == local.encode(text).tolist()
  with pytest.raises(ConfigError, match='no SentencePiece model file at'):
    SentencePieceTokenizer.load(f'{gcs_bucket}/tokenizers/missing.model')


@pytest.mark.parametrize('text', [
    'the quick brown fox jumps over the lazy dog.',
    'a  tree\n\n  under\tthe dog \n',
    'unseen: ZQX 123 ünïcödé 中文 ✓',
])
def test_round_trip(model_path, text):
  tokenizer = SentencePieceTokenizer.load(model_path)
  ids = tokenizer.encode(text)
  assert ids.dtype == np.int32 and ids.ndim == 1
  assert tokenizer.decode(ids) == text
  np.testing.assert_array_equal(tokenizer.encode(text.encode('utf-8')), ids)


def test_decode_drops_specials(model_path):
  tokenizer = SentencePieceTokenizer.load(model_path)
  ids = tokenizer.encode('the dog')
  with_specials = [tokenizer.bos_id, *ids, tokenizer.eos_id, tokenizer.pad_id,
                   tokenizer.vocab_size + 5]
  assert tokenizer.decode(with_specials) == 'the dog'


def test_learns_multi_character_pieces(model_path):
  tokenizer = SentencePieceTokenizer.load(model_path)
  text = 'the quick brown fox'
  assert tokenizer.encode(text).size < len(text)


@pytest.mark.parametrize('text', [
    'the lazy dog sleeps under a tree.\nthen the fox jumps.',
    'ascii and ünïcödé via byte fallback 中文',
])
def test_token_byte_lengths_add_up_to_utf8_length(model_path, text):
  tokenizer = SentencePieceTokenizer.load(model_path)
  lengths = tokenizer.token_byte_lengths()
  assert lengths.shape == (300,) and lengths.dtype == np.int32
  specials = [tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id]
  assert lengths[specials].sum() == 0
  assert lengths[tokenizer.encode(text)].sum() == len(text.encode('utf-8'))


def test_encode_of_invalid_utf8_raises(model_path):
  tokenizer = SentencePieceTokenizer.load(model_path)
  with pytest.raises(ValueError, match='not valid UTF-8'):
    tokenizer.encode(b'abc\xff\xfe')


def test_missing_model_file(tmp_path):
  path = str(tmp_path / 'nothing.model')
  with pytest.raises(ConfigError, match='nothing.model') as error:
    SentencePieceTokenizer.load(path)
  assert error.value.key == 'data.sentencepiece_model'


def test_empty_model_path():
  with pytest.raises(ConfigError) as error:
    SentencePieceTokenizer.load('')
  assert error.value.key == 'data.sentencepiece_model'


def test_corrupt_model_file(tmp_path):
  path = tmp_path / 'corrupt.model'
  path.write_bytes(b'this is not a sentencepiece model \x00\x01\x02')
  with pytest.raises(ConfigError, match='corrupt.model') as error:
    SentencePieceTokenizer.load(str(path))
  assert error.value.key == 'data.sentencepiece_model'
  assert 'not a valid SentencePiece model' in str(error.value)


def test_training_rejects_an_empty_document(tmp_path):
  documents = small_documents(5) + [b''] + small_documents(3)
  with pytest.raises(ValueError, match='index 5 is empty'):
    train_sentencepiece(documents, str(tmp_path / 'm'), vocab_size=300)


def test_training_rejects_non_utf8_and_names_it(tmp_path):
  documents = [Document(f'doc{i}', d) for i, d in enumerate(small_documents(4))]
  documents.insert(2, Document('latin1.txt', 'café'.encode('latin-1')))
  with pytest.raises(ValueError, match=r"'latin1.txt' \(index 2\).*UTF-8"):
    train_sentencepiece(documents, str(tmp_path / 'm'), vocab_size=300)


def test_training_rejects_a_non_positive_sentence_cap(tmp_path):
  with pytest.raises(ValueError, match='max_sentences must be positive'):
    train_sentencepiece(small_documents(4), str(tmp_path / 'm'),
                        vocab_size=300, max_sentences=0)
  assert not (tmp_path / 'm.model').exists()


def test_sample_lines_keeps_all_lines_under_the_cap():
  lines = [f'line {i}' for i in range(30)]
  assert sentencepiece_tokenizer.sample_lines(iter(lines), 30, seed=3) == lines
  assert sentencepiece_tokenizer.sample_lines(iter(lines), 99, seed=3) == lines


def test_sample_lines_is_a_uniform_sample_in_input_order():
  """Each of n lines is in a sample of k with probability k / n."""
  n, k, trials = 50, 10, 3000
  lines = [f'{i:02d}' for i in range(n)]
  counts = np.zeros(n)
  for seed in range(trials):
    sample = sentencepiece_tokenizer.sample_lines(iter(lines), k, seed)
    assert len(sample) == k and len(set(sample)) == k
    assert sample == sorted(sample)  # Input order kept.
    counts[[int(line) for line in sample]] += 1
  expected = trials * k / n
  std = np.sqrt(trials * (k / n) * (1 - k / n))
  assert np.all(np.abs(counts - expected) < 5 * std), counts
  # The sample depends on the seed, and only on it.
  assert (sentencepiece_tokenizer.sample_lines(iter(lines), k, 1) ==
          sentencepiece_tokenizer.sample_lines(iter(lines), k, 1))
  assert (sentencepiece_tokenizer.sample_lines(iter(lines), k, 1) !=
          sentencepiece_tokenizer.sample_lines(iter(lines), k, 2))


_TRAIN_IN_A_FRESH_PROCESS = """
import sys
sys.path.insert(0, {root!r})
from tests.data_pipeline.test_data_sentencepiece import small_documents
from longformer_jax.data.sentencepiece_tokenizer import train_sentencepiece
from longformer_jax.storage import paths
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
train_sentencepiece(small_documents(60), {prefix!r}, vocab_size=300,
                    max_sentences=120, num_threads=2)
"""


def test_training_gives_the_same_file_in_two_processes(tmp_path):
  """SentencePiece's own sentence sampling is not seeded across processes;
  ours is, so the same call trains the same bytes in a new process."""
  root = REPO_ROOT
  prefix = tmp_path / 'tiny'  # The file records its prefix: keep it fixed.
  script = _TRAIN_IN_A_FRESH_PROCESS.format(root=root, prefix=str(prefix))
  models = []
  for _ in range(2):
    subprocess.run([sys.executable, '-c', script], check=True, cwd=root)
    models.append(prefix.with_suffix('.model').read_bytes())
  assert models[0] == models[1]


def test_command_line_trains_on_the_stdlib_corpus(tmp_path, capsys):
  prefix = tmp_path / 'cli' / 'stdlib'
  path = sentencepiece_tokenizer.main([
      '--corpus=stdlib', '--vocab_size=600', f'--out={prefix}',
      '--max_documents=20', '--max_sentences=5000'])
  assert path == f'{prefix}.model'
  assert capsys.readouterr().out.strip().endswith(path)
  tokenizer = SentencePieceTokenizer.load(path)
  assert tokenizer.vocab_size == 600
  source = 'import os\n\ndef main():\n    return os.getcwd()\n'
  assert tokenizer.decode(tokenizer.encode(source)) == source


def test_command_line_trains_on_a_generated_corpus(tmp_path):
  """The generated corpora read their own data settings (passkey its document lengths)."""
  path = sentencepiece_tokenizer.main([
      '--corpus=passkey', '--vocab_size=300', f'--out={tmp_path / "passkey"}',
      '--max_documents=40', '--max_sentences=5000'])
  tokenizer = SentencePieceTokenizer.load(path)
  text = 'The pass key is 71942. Remember it. What is the pass key? The pass key is 71942.'
  assert tokenizer.decode(tokenizer.encode(text)) == text

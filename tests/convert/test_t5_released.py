"""T5 as released: a tokenizer with `<pad>`, `</s>`, `<unk>` and no `<s>`, in `spiece.model`.

The weights, inputs and transformers' logits are the `t5` fixture's
(tests/data/hf/t5, tools/make_hf_fixtures.py); the directory gets T5's
special-token order (pad 0, EOS 1, unk 2, no BOS) in a SentencePiece model
trained here, or in a `tokenizer.json` without `<s>`. Sequence-to-sequence
needs no BOS (the decoder starts with the pad token, as T5's does); the
stream tasks still refuse such a tokenizer, naming what is missing.
"""

import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import sentencepiece as spm

from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import hf
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import decoder_context
from longformer_jax.tasks.registry import task_for
from tests.support.repo_paths import REPO_ROOT as REPO

T5 = os.path.join(REPO, 'tests', 'data', 'hf', 't5')
WORDS = [f'w{i}' for i in range(4, 40)]


def train_t5_spiece(path: str, pad_id: int = 0) -> str:
  """A tiny SentencePiece model with T5's special ids (pad 0, EOS 1, unk 2, no BOS) at
  `path` (`pad_id=-1`: without a pad piece, unk 0)."""
  rng = np.random.default_rng(0)
  sentences = [' '.join(rng.choice(WORDS, size=12)) for _ in range(200)]
  ids = dict(pad_id=0, eos_id=1, unk_id=2) if pad_id == 0 else dict(pad_id=-1, eos_id=1, unk_id=0)
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_prefix=path[:-len('.model')], vocab_size=48,
      model_type='unigram', bos_id=-1, hard_vocab_limit=False, minloglevel=2, num_threads=1,
      **ids)
  return path


def t5_tokenizer_json(path: str) -> str:
  """A word-level `tokenizer.json` in T5's order: `<pad>` 0, `</s>` 1, `<unk>` 2, no `<s>`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  specials = ['<pad>', '</s>', '<unk>']
  vocab = {token: i for i, token in enumerate(specials)}
  vocab.update({f'w{i}': i for i in range(3, 96)})
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer.add_special_tokens(specials)
  tokenizer.save(path)
  return path


def released_t5(directory, tokenizer: str = 'spiece') -> str:
  """The `t5` fixture's config (with T5's `eos_token_id` 1) and weights, and a T5 tokenizer:
  `spiece.model` or `tokenizer.json`."""
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  shutil.copy(os.path.join(T5, 'model.safetensors'), directory)
  with open(os.path.join(T5, 'config.json')) as f:
    config = json.load(f)
  config['eos_token_id'] = 1
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(config, f)
  if tokenizer == 'spiece':
    train_t5_spiece(os.path.join(directory, 'spiece.model'))
  else:
    t5_tokenizer_json(os.path.join(directory, 'tokenizer.json'))
  return directory


def convert(hf_dir: str, workdir: str, *extra) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={hf_dir}',
       f'--workdir={workdir}', *extra], cwd=REPO, capture_output=True, text=True, check=False)


def written_config(workdir: str) -> ml_collections.ConfigDict:
  namespace = {}
  with open(os.path.join(workdir, 'import_config.py')) as f:
    exec(f.read(), namespace)  # pylint: disable=exec-used
  return ml_collections.ConfigDict(resolve_config(namespace['get_config']()))


@pytest.fixture(scope='module')
def spiece_import(tmp_path_factory):
  base = tmp_path_factory.mktemp('t5_released')
  hf_dir = released_t5(base / 'hf')
  result = convert(hf_dir, str(base / 'out'), '--task=seq2seq')
  assert result.returncode == 0, result.stderr[-2000:]
  return hf_dir, written_config(str(base / 'out')), str(base / 'out')


def test_cli_finds_spiece_model_and_needs_no_bos(spiece_import):
  hf_dir, config, _ = spiece_import
  assert config.data.tokenizer == 'sentencepiece'
  assert config.data.sentencepiece_model == os.path.join(os.path.abspath(hf_dir), 'spiece.model')
  tokenizer = task_for(config.task).tokenizer(config.data)
  assert not tokenizer.has_bos
  # T5's decoder starts with the pad token, which the seq2seq examples then begin with.
  assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id) == (0, 1, 0)


def test_the_imported_model_gives_transformers_logits(spiece_import):
  hf_dir, config, _ = spiece_import
  tokenizer = task_for(config.task).tokenizer(config.data)
  _, model = task_for(config.task).model(config, tokenizer.vocab_size)
  _, params = hf.load(config.train.init_from_hf)
  assert os.path.samefile(config.train.init_from_hf, hf_dir)
  source_mask = np.load(os.path.join(T5, 'attention_mask.npy')).astype(bool)
  target_mask = np.load(os.path.join(T5, 'decoder_attention_mask.npy')).astype(bool)
  logits, _ = model.apply(
      {'params': params}, jnp.asarray(np.load(os.path.join(T5, 'input_ids.npy'))),
      encoder_context(jnp.asarray(source_mask), jnp.zeros_like(source_mask), deterministic=True),
      jnp.asarray(np.load(os.path.join(T5, 'decoder_input_ids.npy'))),
      decoder_context(jnp.asarray(target_mask), deterministic=True))
  reference = np.load(os.path.join(T5, 'logits.npy'))
  assert logits.shape == reference.shape
  error = np.abs(np.asarray(logits)[target_mask] - reference[target_mask]).max()
  assert error <= 1e-4 * np.abs(reference[target_mask]).max()


def test_cli_reads_a_tokenizer_json_without_bos(tmp_path):
  hf_dir = released_t5(tmp_path / 'hf', tokenizer='json')
  result = convert(hf_dir, str(tmp_path / 'out'), '--task=seq2seq')
  assert result.returncode == 0, result.stderr[-2000:]
  config = written_config(str(tmp_path / 'out'))
  assert config.data.tokenizer == 'hf'
  tokenizer = task_for('seq2seq').tokenizer(config.data)
  assert (tokenizer.has_bos, tokenizer.pad_id, tokenizer.eos_id) == (False, 0, 1)


def test_spiece_model_passed_explicitly(tmp_path):
  hf_dir = released_t5(tmp_path / 'hf', tokenizer='json')
  model = train_t5_spiece(str(tmp_path / 'elsewhere.model'))
  result = convert(hf_dir, str(tmp_path / 'out'), '--task=seq2seq', f'--tokenizer_file={model}')
  assert result.returncode == 0, result.stderr[-2000:]
  assert written_config(str(tmp_path / 'out')).data.sentencepiece_model == model


@pytest.mark.parametrize('tokenizer', ['spiece', 'json'])
def test_tasks_that_need_bos_name_what_is_missing(tmp_path, tokenizer):
  hf_dir = released_t5(tmp_path, tokenizer)
  if tokenizer == 'spiece':
    data = {'tokenizer': 'sentencepiece', 'sentencepiece_model': f'{hf_dir}/spiece.model'}
    key, words = 'data.sentencepiece_model', 'defines no BOS piece (bos_id=-1)'
  else:
    data = {'tokenizer': 'hf', 'tokenizer_file': f'{hf_dir}/tokenizer.json'}
    key, words = 'data.tokenizer_file', 'has no beginning-of-text token'
  for task in ('lm', 'classification'):
    with pytest.raises(ConfigError) as info:
      task_for(task).tokenizer(ml_collections.ConfigDict(data))
    message = str(info.value)
    assert key in message and words in message and f"task '{task}'" in message
    assert 'pad' not in message.split('(bos_id')[0] and '\n' not in message


def test_a_spiece_model_without_pad_names_the_pad(tmp_path):
  model = train_t5_spiece(str(tmp_path / 'nopad.model'), pad_id=-1)
  with pytest.raises(ConfigError, match=r'defines no pad piece \(pad_id=-1\)'):
    task_for('seq2seq').tokenizer(ml_collections.ConfigDict({'tokenizer': 'sentencepiece',
                                                             'sentencepiece_model': model}))


@pytest.mark.parametrize('flag, words', [
    ('--tokenizer_file=/no/such/spiece.model', '--tokenizer_file=/no/such/spiece.model: no such'),
    (None, 'no tokenizer (tokenizer.json, tokenizer.model, spiece.model)')])
def test_missing_tokenizer_is_one_line(tmp_path, flag, words):
  hf_dir = released_t5(tmp_path / 'hf')
  if flag is None:
    os.remove(os.path.join(hf_dir, 'spiece.model'))
  result = convert(hf_dir, str(tmp_path / 'out'), '--task=seq2seq', *([flag] if flag else []))
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and words in lines[-1]


@pytest.mark.slow
def test_train_and_eval_fine_tune_it(spiece_import, tmp_path):
  """train.py fine-tunes from the written config and eval.py scores the run: both read the
  tokenizer for task seq2seq (no BOS needed)."""
  config_file = os.path.join(spiece_import[2], 'import_config.py')
  run_dir = str(tmp_path / 'run')
  result = subprocess.run(
      [sys.executable, 'train.py', f'--config={config_file}', f'--workdir={run_dir}',
       '--config.train.num_steps=2', '--config.train.eval_every=0',
       '--config.data.batch_size=8', '--config.data.eval_batch_size=8',
       '--config.data.corpus=synthetic', '--config.data.max_examples=16',
       '--config.data.seq_len=32', '--config.data.target_len=8'],
      cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  result = subprocess.run([sys.executable, 'eval.py', f'--workdir={run_dir}'], cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'ROUGE-1' in result.stdout

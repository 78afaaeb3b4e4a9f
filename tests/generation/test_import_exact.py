"""An imported decoder generates exactly as the original within its context, by default.

The llama_long and gpt2_long fixtures (contexts of 320 and 300 tokens) hold
transformers' greedy tokens and logits after a 262-token prompt: generate.py's
default decoder gives them (in Python and through --prompt_ids). Copies of the
llama and gpt2 fixtures with such contexts (llama: max_position_embeddings=320;
gpt2: n_positions=300, the position table extended): greedy decoding of another
262-token prompt equals greedy decoding by full recomputes (one chunk holding
the whole text). Past the context, one notice line names the memory that takes
over.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import generate
from longformer_jax.convert import hf
from longformer_jax.convert.workdir_cli import convert_to_workdir
from longformer_jax.generation.sampling import SamplingSettings
from longformer_jax.generation.text_generation import generate_text
from tests.support.full_causal_logits import full_logits
from tests.support.hf_checkpoints import edited_copy
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf')
PROMPT_LEN, NEW = 262, 4
GREEDY = SamplingSettings(temperature=0.0).validate()


def long_copy(name: str, destination) -> str:
  """`name`'s fixture with a context of 300+ tokens (tokenizer.json copied)."""
  os.makedirs(destination)
  if name == 'gpt2':
    def extend(tensors):
      table = tensors['transformer.wpe.weight']
      extra = np.random.default_rng(1).normal(0, 0.02, (300 - table.shape[0], table.shape[1]))
      tensors['transformer.wpe.weight'] = np.concatenate([table, extra.astype(np.float32)])
    hf_dir = edited_copy(os.path.join(DATA, name), destination, edit_tensors=extend,
                         edit_config=lambda c: c.update(n_positions=300))
  else:
    hf_dir = edited_copy(os.path.join(DATA, name), destination,
                         edit_config=lambda c: c.update(max_position_embeddings=320))
  shutil.copy(os.path.join(DATA, name, 'tokenizer.json'), hf_dir)
  return hf_dir


def imported(name, tmp_path, long=True):
  hf_dir = long_copy(name, tmp_path / 'hf') if long else os.path.join(DATA, name)
  workdir = str(tmp_path / 'run')
  convert_to_workdir(hf_dir, workdir)
  return hf_dir, workdir


def prompt_ids(length: int) -> list:
  return [1] + np.random.default_rng(0).integers(3, 96, length - 1).tolist()


def full_recompute_greedy(hf_dir: str, prompt: list, new: int) -> tuple:
  """(greedy tokens, logits after the prompt) of the whole text in one chunk at every step."""
  model_config, params = hf.load(hf_dir)
  tokens, first = list(prompt), None
  for _ in range(new):
    logits = full_logits(model_config, params, np.asarray(tokens, np.int32))[-1]
    first = logits if first is None else first
    tokens.append(int(np.argmax(logits[:96])))
  return tokens[len(prompt):], first


@pytest.mark.parametrize('name', ['llama', 'gpt2'])
def test_default_generation_past_256_tokens_equals_the_full_model(name, tmp_path):
  hf_dir, workdir = imported(name, tmp_path)
  decoder, tokenizer, _ = generate.load_decoder(workdir)
  prompt = prompt_ids(PROMPT_LEN)
  expected, first = full_recompute_greedy(hf_dir, prompt, NEW)
  state = decoder.start(prompt)
  np.testing.assert_allclose(np.asarray(state.logits)[:96], first[:96], rtol=1e-4, atol=1e-4)
  result = generate_text(decoder, tokenizer, prompt, settings=GREEDY, max_new_tokens=NEW)
  assert result.token_ids == expected


@pytest.mark.parametrize('name', ['llama_long', 'gpt2_long'])
def test_default_decoding_gives_transformers_greedy_logits(name, tmp_path):
  """Fixtures with contexts of 320 / 300 tokens: after the fixture's 262-token prompt, each
  step's logits are transformers' (to 1e-4) and their argmax its greedy tokens."""
  directory = os.path.join(DATA, name)
  workdir = str(tmp_path / 'run')
  convert_to_workdir(directory, workdir)
  decoder, _, _ = generate.load_decoder(workdir)
  prompt = np.load(os.path.join(directory, 'long_prompt_ids.npy'))
  greedy = np.load(os.path.join(directory, 'greedy_ids.npy'))
  reference = np.load(os.path.join(directory, 'greedy_logits.npy'))
  state = decoder.start(prompt)
  for step, token in enumerate(greedy):
    logits = np.asarray(state.logits)[:reference.shape[1]]
    np.testing.assert_allclose(logits, reference[step], rtol=1e-4, atol=1e-4)
    assert int(np.argmax(logits)) == token
    state = decoder.append(state, int(token))


def test_eval_scores_in_chunks_of_the_context(tmp_path):
  workdir = str(tmp_path / 'run')
  convert_to_workdir(os.path.join(DATA, 'llama_long'), workdir)
  with open(os.path.join(workdir, 'hf_import.json')) as f:
    assert json.load(f)['context_len'] == 320
  for extra, chunk in (([], 320), (['--config.eval.chunk_len=64'], 64)):
    result = subprocess.run(
        [sys.executable, 'eval.py', f'--workdir={workdir}', '--config.eval.max_tokens=700',
         *extra], cwd=REPO, capture_output=True, text=True, check=False,
        env=dict(os.environ, JAX_PLATFORMS='cpu'))
    assert result.returncode == 0, result.stderr[-1000:]
    with open(os.path.join(workdir, 'eval', 'metrics.json')) as f:
      assert json.load(f)['chunk_len'] == chunk


@pytest.mark.parametrize('name,which', [('llama', 'key/value cache keeps the last 64 tokens'),
                                        ('gpt2', 'configured memory takes over')])
def test_past_the_context_one_notice_names_the_memory(name, which, tmp_path, capsys):
  _, workdir = imported(name, tmp_path, long=False)
  decoder, tokenizer, _ = generate.load_decoder(workdir)
  context = 64 if name == 'llama' else 32
  generate_text(decoder, tokenizer, prompt_ids(context - 1), settings=GREEDY, max_new_tokens=4)
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and which in lines[0] and f'({context} tokens)' in lines[0], lines


def test_cli_prompt_ids_prints_transformers_greedy_ids(tmp_path):
  directory = os.path.join(DATA, 'llama_long')
  workdir = str(tmp_path / 'run')
  convert_to_workdir(directory, workdir)
  prompt = np.load(os.path.join(directory, 'long_prompt_ids.npy')).tolist()
  expected = np.load(os.path.join(directory, 'greedy_ids.npy')).tolist()
  ids_file = tmp_path / 'ids.txt'
  ids_file.write_text(' '.join(map(str, prompt)))
  for source in (f'--prompt_ids={",".join(map(str, prompt))}', f'--prompt_ids_file={ids_file}'):
    result = subprocess.run(
        [sys.executable, 'generate.py', f'--workdir={workdir}', source, '--temperature=0',
         f'--max_new_tokens={len(expected)}'], cwd=REPO, capture_output=True, text=True, check=False,
        env=dict(os.environ, JAX_PLATFORMS='cpu'))
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.strip() == ','.join(map(str, expected))


@pytest.mark.parametrize('flag,message', [('--prompt_ids=1,x,3', "'x' is not a token id"),
                                          ('--prompt_ids=1,5000', 'vocabulary size')])
def test_cli_bad_prompt_ids_are_one_line(flag, message, tmp_path):
  _, workdir = imported('llama', tmp_path, long=False)
  result = subprocess.run([sys.executable, 'generate.py', f'--workdir={workdir}', flag],
                          cwd=REPO, capture_output=True, text=True, check=False,
                          env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], result.stderr[-500:]

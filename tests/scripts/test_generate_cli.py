"""generate.py on a checkpoint written by a few steps of train.py: prints the text that
generation produces, honours stop strings, and reports bad input in one line with status 2."""

import os
import subprocess
import sys

import pytest

import generate as generate_script
import train as train_script
from longformer_jax.config.errors import ConfigError, UserError
from longformer_jax.generation.sampling import SamplingSettings
from longformer_jax.generation.text_generation import generate_text
from tests.support.repo_paths import REPO_ROOT
from tests.support.tiny_models import tiny_config

PROMPT = 'import os\nimport sys\n\n\ndef main(argv):\n    '


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """A tiny Transformer-XL run of 2 training steps (1 layer, chunk 8, memory 16)."""
  workdir = str(tmp_path_factory.mktemp('generate_run'))
  config = tiny_config(attention='xl', num_layers=1)
  config.train.update(num_steps=2, checkpoint_every=2, eval_every=0, log_every=1)
  train_script.train(config, workdir)
  return workdir


@pytest.fixture(scope='module')
def greedy_text(workdir):
  """The greedy continuation of PROMPT, generated in this process."""
  decoder, tokenizer, step = generate_script.load_decoder(workdir)
  assert step == 2
  result = generate_text(decoder, tokenizer, PROMPT, settings=SamplingSettings(temperature=0),
                         max_new_tokens=24)
  assert len(result.text) >= 4
  return result.text


def run_generate(*args, timeout=300):
  return subprocess.run([sys.executable, 'generate.py', *args], cwd=REPO_ROOT, text=True,
                        capture_output=True, timeout=timeout,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))


def test_cli_prints_the_generated_text_up_to_the_stop_string(workdir, greedy_text, tmp_path):
  start = next(i for i in range(1, len(greedy_text) - 1) if '\ufffd' not in greedy_text[i:i + 2])
  stop = greedy_text[start:start + 2]
  prompt_file = tmp_path / 'prompt.txt'
  prompt_file.write_text(PROMPT, encoding='utf-8')
  result = run_generate(f'--workdir={workdir}', f'--prompt_file={prompt_file}',
                        '--temperature=0', '--max_new_tokens=24', '--stop=NEVER PRINTED',
                        f'--stop={stop}')
  assert result.returncode == 0, result.stderr
  assert result.stdout == greedy_text[:greedy_text.find(stop)] + '\n'


def test_bad_input_is_one_line_naming_the_culprit_with_status_2(tmp_path):
  result = run_generate(f'--workdir={tmp_path / "missing"}', '--prompt=hello', timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"error: --workdir: '{tmp_path / 'missing'}' is not a directory (a train.py workdir)"]
  assert 'Traceback' not in result.stderr and result.stdout == ''


def test_prompt_errors_name_the_flag(tmp_path):
  with pytest.raises(UserError, match='^--prompt: the prompt is empty'):
    generate_script.read_prompt('', None)
  with pytest.raises(UserError, match='exactly one of them'):
    generate_script.read_prompt('a', 'b')
  with pytest.raises(UserError, match='exactly one of them'):
    generate_script.read_prompt(None, None)
  latin1 = tmp_path / 'latin1.txt'
  latin1.write_bytes('café au lait'.encode('latin-1'))
  with pytest.raises(UserError, match=r"^--prompt_file: '.*latin1.txt' is not UTF-8 text "
                     r'\(invalid continuation byte at byte 3\)'):
    generate_script.read_prompt(None, str(latin1))
  with pytest.raises(UserError, match='^--prompt_file: no such file'):
    generate_script.read_prompt(None, str(tmp_path / 'none.txt'))
  empty = tmp_path / 'empty.txt'
  empty.write_bytes(b'')
  with pytest.raises(UserError, match='^--prompt_file: the prompt is empty'):
    generate_script.read_prompt(None, str(empty))
  assert generate_script.read_prompt('é', None) == 'é'


@pytest.mark.parametrize('temperature,top_k,top_p,message', [
    (-1.0, 0, 1.0, '--temperature: -1.0 must be >= 0'),
    (1.0, -2, 1.0, '--top_k: -2 must be >= 0'),
    (1.0, 0, 0.0, '--top_p: 0.0 must be in (0, 1]'),
    (1.0, 0, 1.01, '--top_p: 1.01 must be in (0, 1]'),
])
def test_bad_sampling_values_name_the_flag(temperature, top_k, top_p, message):
  with pytest.raises(UserError) as error:
    generate_script.sampling_settings(temperature, top_k, top_p)
  assert str(error.value).startswith(message)


def test_bad_generation_flags_and_missing_checkpoints_name_the_culprit(workdir, tmp_path):
  with pytest.raises(UserError, match='^--max_new_tokens: 0 must be >= 1'):
    generate_script.check_generation_flags(0, [])
  with pytest.raises(UserError, match='^--stop: a stop string must not be empty'):
    generate_script.check_generation_flags(8, ['\n', ''])
  with pytest.raises(UserError, match='config.json not found'):
    generate_script.run_config(str(tmp_path), -1)
  empty_run = tmp_path / 'no_checkpoint'
  empty_run.mkdir()
  (empty_run / 'config.json').write_text(open(os.path.join(workdir, 'config.json')).read())
  with pytest.raises(FileNotFoundError, match='no checkpoint in .*; train first'):
    generate_script.load_decoder(str(empty_run))
  with pytest.raises(FileNotFoundError, match=r'\[2\]'):
    generate_script.load_decoder(workdir, step=7)


def test_a_run_that_cannot_generate_is_refused_before_restoring(workdir, tmp_path):
  run = tmp_path / 'bidirectional'
  run.mkdir()
  text = open(os.path.join(workdir, 'config.json')).read()
  (run / 'config.json').write_text(text.replace('"causal": true', '"causal": false'))
  with pytest.raises(ConfigError, match='^config.model.causal: False: a bidirectional model'):
    generate_script.load_decoder(str(run))

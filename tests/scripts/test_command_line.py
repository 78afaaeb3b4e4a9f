"""The command line: `--config.KEY=VALUE` overrides, one-line errors with exit status 2."""

import os
import subprocess
import sys
import textwrap

import pytest

from longformer_jax.command_line import DEFAULT_CONFIG, experiment_config, split_config_overrides
from longformer_jax.config.errors import ConfigError
from tests.support.repo_paths import REPO_ROOT


# A script with train.py's command line whose main only builds the config.
SCRIPT = textwrap.dedent('''
    from absl import flags
    from longformer_jax import command_line
    def main(argv):
      config = command_line.flag_config()
      print('num_steps', config.train.num_steps, 'clamp_len', config.model.xl.clamp_len)
    command_line.define_flags('workdir')
    command_line.run(main)
''')


def run_script(*args):
  return subprocess.run([sys.executable, '-c', SCRIPT, *args], cwd=REPO_ROOT, text=True,
                        capture_output=True, timeout=120,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))


def test_overrides_are_split_from_the_other_flags():
  argv, overrides = split_config_overrides(
      ['train.py', '--workdir=w', '--config.model.xl.clamp_len=4', '--config.train.num_steps', '7'])
  assert argv == ['train.py', '--workdir=w']
  assert overrides == [('model.xl.clamp_len', '4'), ('train.num_steps', '7')]
  with pytest.raises(ConfigError, match='needs a value'):
    split_config_overrides(['train.py', '--config.train.num_steps'])


def test_overrides_parse_by_the_type_of_their_key():
  config = experiment_config(DEFAULT_CONFIG, [('model.xl.clamp_len', '4'),
                                              ('model.causal', 'true'),
                                              ('optimizer.learning_rate', '1e-3'),
                                              ('parallel.mesh_shape', '(1,-1,1)'),
                                              ('seed', '3')])
  assert config.seed == 3 and config.model.xl.clamp_len == 4 and config.model.causal is True
  assert config.optimizer.learning_rate == 1e-3 and config.parallel.mesh_shape == (1, -1, 1)


def test_override_of_a_renamed_key_says_where_it_went():
  with pytest.raises(ConfigError, match='config.model.clamp_len: unknown key; it is now '
                     'model.xl.clamp_len'):
    experiment_config(DEFAULT_CONFIG, [('model.clamp_len', '4')])


def test_command_line_runs_with_overrides():
  result = run_script('--config.train.num_steps=7', '--config.model.xl.clamp_len=4')
  assert result.returncode == 0, result.stderr
  assert 'num_steps 7 clamp_len 4' in result.stdout


@pytest.mark.parametrize('args,message', [
    (['--config.model.xl.clamp_lem=3'],
     'error: config.model.xl.clamp_lem: unknown key; did you mean clamp_len?'),
    (['--config.train.stop_after_steps=-2'],
     'error: config.train.stop_after_steps: -2 must be >= 0 (0: off)'),
    (['--config.seed=one'], "error: config.seed: 'one' is not an int"),
    (['--config=configs/no_such_config.py'],
     "error: --config: 'configs/no_such_config.py': no such config file"),
])
def test_bad_input_is_one_line_with_status_2(args, message):
  result = run_script(*args)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [message]


def test_debug_shows_the_traceback():
  result = run_script('--config.train.num_step=3', '--debug')
  assert result.returncode == 2
  assert 'Traceback' in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      'error: config.train.num_step: unknown key; did you mean num_steps?')


def test_config_file_argument_after_colon_reaches_get_config():
  path = os.path.join(REPO_ROOT, 'configs', 'sparse_transformer.py')
  config = experiment_config(f'{path}:fixed,multihead', [])
  assert config.model.sparse_transformer.pattern == 'fixed'
  assert config.model.sparse_transformer.integration == 'multihead'
  with pytest.raises(ConfigError, match="unknown choices \\['fixd'\\]"):
    experiment_config(f'{path}:fixd', [])
  with pytest.raises(ConfigError, match='takes no argument'):
    experiment_config(os.path.join(REPO_ROOT, 'configs', 'default.py') + ':fixed', [])


@pytest.mark.parametrize('script', ['train.py', 'eval.py'])
def test_a_bad_flag_is_answered_before_the_storage_and_logging_clients_load(script):
  """gcsfs (with aiohttp and google-auth) loads with the first gs:// path and tensorboardX
  (which imports PyTorch where installed) with the first metrics written: a command that
  stops at a bad flag imports neither (Python's own import log says what was imported)."""
  result = subprocess.run([sys.executable, '-X', 'importtime', script, '--config.seed=one'],
                          cwd=REPO_ROOT, text=True, capture_output=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert result.returncode == 2
  imported = {line.rsplit('|', 1)[-1].strip() for line in result.stderr.splitlines()
              if line.startswith('import time:')}
  assert 'jax' in imported     # the log is read right
  assert not {'gcsfs', 'aiohttp', 'tensorboardX', 'torch'} & imported

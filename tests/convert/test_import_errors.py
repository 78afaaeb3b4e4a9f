"""Broken inputs give one line naming the culprit: a truncated or corrupt `model.safetensors`,
a shard of `model.safetensors.index.json` that is missing, an unreadable index (the importer,
`python -m longformer_jax.convert.hf`), and a workdir whose `config.json` does not fit its
checkpoint (generate.py, eval.py). The command lines exit with status 2 and print no traceback."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.numpy import load_file, save_file

from tests.support.hf_checkpoints import conversion_error
from tests.support.repo_paths import REPO_ROOT as REPO

LLAMA = os.path.join(REPO, 'tests', 'data', 'hf', 'llama')


def run(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                        check=False)


def assert_one_line_error(result: subprocess.CompletedProcess, *culprits: str) -> str:
  assert result.returncode == 2, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith('error: ')
  for culprit in culprits:
    assert culprit in line, line
  return line


def import_cli(hf_dir, workdir) -> subprocess.CompletedProcess:
  return run('-m', 'longformer_jax.convert.hf', f'--hf_dir={hf_dir}', f'--workdir={workdir}')


def llama_copy(directory) -> str:
  directory = str(directory)
  shutil.copytree(LLAMA, directory)
  return directory


def truncate(path: str, keep: float) -> None:
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:int(len(data) * keep)])


@pytest.mark.parametrize('damage', ['truncated_data', 'truncated_header', 'garbage'])
def test_a_broken_weights_file_is_named(tmp_path, damage):
  hf_dir = llama_copy(tmp_path / 'hf')
  path = os.path.join(hf_dir, 'model.safetensors')
  if damage == 'truncated_data':
    truncate(path, 0.5)
  elif damage == 'truncated_header':
    truncate(path, 0.002)
  else:
    with open(path, 'wb') as f:
      f.write(b'\x7f' * 4096)
  message = conversion_error(hf_dir)
  assert path in message and 'not a readable safetensors file' in message
  assert_one_line_error(import_cli(hf_dir, tmp_path / 'out'), path, 'safetensors')


def sharded_copy(directory) -> str:
  """The llama fixture as two shards and `model.safetensors.index.json`."""
  directory = str(directory)
  os.makedirs(directory)
  shutil.copy(os.path.join(LLAMA, 'config.json'), directory)
  tensors = load_file(os.path.join(LLAMA, 'model.safetensors'))
  names = sorted(tensors)
  shards = {'model-00001-of-00002.safetensors': names[:len(names) // 2],
            'model-00002-of-00002.safetensors': names[len(names) // 2:]}
  weight_map = {}
  for shard, shard_names in shards.items():
    save_file({name: tensors[name] for name in shard_names}, os.path.join(directory, shard))
    weight_map.update({name: shard for name in shard_names})
  with open(os.path.join(directory, 'model.safetensors.index.json'), 'w') as f:
    json.dump({'metadata': {}, 'weight_map': weight_map}, f)
  shutil.copy(os.path.join(LLAMA, 'tokenizer.json'), directory)
  return directory


def test_shards_load_and_a_missing_shard_is_named(tmp_path):
  from longformer_jax.convert import hf  # pylint: disable=g-import-not-at-top
  hf_dir = sharded_copy(tmp_path / 'hf')
  hf.load(hf_dir)                                  # the intact shards load
  missing = os.path.join(hf_dir, 'model-00002-of-00002.safetensors')
  os.remove(missing)
  assert missing in conversion_error(hf_dir)
  assert_one_line_error(import_cli(hf_dir, tmp_path / 'out'), missing, 'is missing')


def test_a_truncated_shard_is_named(tmp_path):
  hf_dir = sharded_copy(tmp_path / 'hf')
  shard = os.path.join(hf_dir, 'model-00001-of-00002.safetensors')
  truncate(shard, 0.5)
  assert_one_line_error(import_cli(hf_dir, tmp_path / 'out'), shard, 'safetensors')


@pytest.mark.parametrize('index', ['{"weight_map": ', '[1, 2]', '{"weight_map": {"a": 3}}'])
def test_an_unreadable_index_is_named(tmp_path, index):
  hf_dir = sharded_copy(tmp_path / 'hf')
  path = os.path.join(hf_dir, 'model.safetensors.index.json')
  with open(path, 'w') as f:
    f.write(index)
  assert_one_line_error(import_cli(hf_dir, tmp_path / 'out'), path, 'not a valid index')


@pytest.fixture(scope='module')
def edited_workdir(tmp_path_factory) -> str:
  """An imported llama workdir whose config.json asks for twice the feed-forward width."""
  workdir = str(tmp_path_factory.mktemp('edited') / 'run')
  result = import_cli(LLAMA, workdir)
  assert result.returncode == 0, result.stderr[-2000:]
  path = os.path.join(workdir, 'config.json')
  with open(path) as f:
    config = json.load(f)
  config['model']['d_ff'] *= 2
  with open(path, 'w') as f:
    json.dump(config, f)
  return workdir


def test_generate_on_a_workdir_whose_config_does_not_fit_its_checkpoint(edited_workdir):
  result = run('generate.py', f'--workdir={edited_workdir}', '--prompt=w5 w6',
               '--max_new_tokens=2')
  line = assert_one_line_error(result, os.path.join(edited_workdir, 'config.json'),
                               'does not fit the checkpoint')
  assert 'feed_forward/wi/kernel: saved (32, 64), now (32, 128)' in line


def test_eval_on_a_workdir_whose_config_does_not_fit_its_checkpoint(edited_workdir):
  """eval.py reports the mismatch in one line too (command_line.user_errors)."""
  result = run('eval.py', f'--workdir={edited_workdir}', '--config.eval.max_tokens=64')
  assert_one_line_error(result, os.path.join(edited_workdir, 'checkpoints'),
                        'feed_forward/wi/kernel: saved (32, 64), now (32, 128)')

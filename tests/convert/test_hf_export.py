"""convert/hf_export.py: import, export, import gives the same parameters, and the exported
tensors are the original file's (read with safetensors' numpy API)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from longformer_jax.convert import hf, hf_export
from longformer_jax.convert.errors import ConversionError
from longformer_jax.convert.workdir_cli import convert_to_workdir
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf')
# Tensors a file may carry that the export does not write: GPT-2's mask buffers.
NOT_WRITTEN = ('.attn.bias', '.attn.masked_bias')


@pytest.mark.parametrize('name', ['gpt2', 'llama', 'mistral', 'qwen2', 'qwen2_window'])
def test_import_export_import_round_trip(name, tmp_path):
  source = os.path.join(DATA, name)
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'out')
  convert_to_workdir(source, workdir)
  written = hf_export.export(workdir, out)
  assert {'config.json', 'model.safetensors', 'tokenizer.json'} <= set(written)

  original, exported = load_file(os.path.join(source, 'model.safetensors')), load_file(
      os.path.join(out, 'model.safetensors'))
  expected_names = {k for k in original if not k.endswith(NOT_WRITTEN)}
  assert set(exported) == expected_names
  for key, value in exported.items():
    assert value.dtype == np.float32 and np.array_equal(value, original[key]), key

  with open(os.path.join(source, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(out, 'config.json')) as f:
    assert json.load(f) == dict(config, dtype='float32')

  (config_a, params_a), (config_b, params_b) = hf.load(source), hf.load(out)
  assert config_a == config_b
  leaves_a, tree_a = jax.tree_util.tree_flatten(params_a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(params_b)
  assert tree_a == tree_b
  assert all(np.array_equal(a, b) for a, b in zip(leaves_a, leaves_b))


def test_bad_workdirs_are_named(tmp_path):
  with pytest.raises(ConversionError, match='is not a directory'):
    hf_export.export(str(tmp_path / 'nowhere'), str(tmp_path / 'out'))
  with pytest.raises(ConversionError, match='no hf_import.json'):
    hf_export.export(str(tmp_path), str(tmp_path / 'out'))
  (tmp_path / 'hf_import.json').write_text(json.dumps({'hf_config': {'model_type': 'bert'}}))
  with pytest.raises(ConversionError, match="'bert' has no exporter"):
    hf_export.export(str(tmp_path), str(tmp_path / 'out'))


def test_a_run_whose_model_differs_from_its_import_is_refused(tmp_path):
  workdir = str(tmp_path / 'run')
  convert_to_workdir(os.path.join(DATA, 'llama'), workdir)
  path = os.path.join(workdir, 'hf_import.json')
  with open(path) as f:
    info = json.load(f)
  info['hf_config']['rms_norm_eps'] = 1e-3
  with open(path, 'w') as f:
    json.dump(info, f)
  with pytest.raises(ConversionError, match='model.norm_epsilon'):
    hf_export.export(workdir, str(tmp_path / 'out'))


def test_command_line_errors_are_one_line(tmp_path):
  for args in ([f'--workdir={tmp_path}', f'--out={tmp_path / "out"}'],
               [f'--workdir={tmp_path / "nowhere"}', f'--out={tmp_path / "out"}'],
               [f'--workdir={tmp_path}']):
    result = subprocess.run([sys.executable, '-m', 'longformer_jax.convert.hf_export', *args],
                            cwd=REPO, capture_output=True, text=True, check=False,
                            env=dict(os.environ, JAX_PLATFORMS='cpu'))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-500:]
    assert ('hf_import.json' in lines[0] or 'not a directory' in lines[0]
            or '--out' in lines[0]), lines

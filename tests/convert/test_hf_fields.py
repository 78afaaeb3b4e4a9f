"""Every field of a Hugging Face config.json is read or known to be inert (convert/hf_fields.py);
any other field, and a function-changing value the importer does not implement, is refused in
one line naming it."""

import os
import subprocess
import sys

import pytest

from longformer_jax.convert import hf_fields
from longformer_jax.convert.hf_config import read_hf_config
from longformer_jax.convert.loader import model_settings
from tests.support.hf_checkpoints import conversion_error, edited_copy
from tests.support.repo_paths import REPO_ROOT

DATA = os.path.join(REPO_ROOT, 'tests', 'data', 'hf')
FIXTURES = sorted(os.listdir(DATA))


@pytest.mark.parametrize('name', FIXTURES)
def test_every_fixture_field_is_listed_and_imports(name):
  hf = read_hf_config(os.path.join(DATA, name))
  model_type = hf['model_type']
  unlisted = [k for k in hf if k not in hf_fields.READ[model_type] | hf_fields.INERT[model_type]
              | hf_fields.COMMON_INERT | set(hf_fields.FIXED[model_type])
              | set(hf_fields.COMMON_FIXED)]
  assert not unlisted
  model_settings(os.path.join(DATA, name))     # check_fields passes


def test_read_and_inert_lists_do_not_overlap():
  for model_type, read in hf_fields.READ.items():
    assert not read & hf_fields.INERT[model_type], model_type


@pytest.mark.parametrize('name', ['gpt2', 'llama', 'qwen2', 'longformer', 'led', 't5'])
def test_unknown_field_is_refused_by_name(name, tmp_path):
  message = conversion_error(edited_copy(os.path.join(DATA, name), tmp_path,
                                         edit_config=lambda c: c.update(new_attention_trick=1)))
  assert "'new_attention_trick'" in message and 'not known' in message


@pytest.mark.parametrize('name,edit,culprit', [
    # GPT-2 untied: transformers would give a head the file does not hold
    ('gpt2', {'tie_word_embeddings': False}, 'tie_word_embeddings'),
    ('gpt2', {'pruned_heads': {'0': [1]}}, 'pruned_heads'),
    ('longformer', {'tie_word_embeddings': False}, 'tie_word_embeddings'),
    ('t5', {'is_decoder': True}, 'is_decoder'),
    # Mistral's and Qwen2's attention has no attention_bias setting in transformers
    ('mistral', {'attention_bias': True}, 'attention_bias'),
    ('qwen2', {'mlp_bias': True}, 'mlp_bias'),
    # a RoPE scaling the importer does not compute (yarn, dynamic, longrope: it does)
    ('llama', {'rope_parameters': {'rope_type': 'proportional', 'rope_theta': 1e4}},
     'rope_type'),
    ('llama', {'quantization_config': {'quant_method': 'bitsandbytes'}}, 'quantization_config'),
])
def test_function_changing_value_not_implemented_is_refused(name, edit, culprit, tmp_path):
  message = conversion_error(edited_copy(os.path.join(DATA, name), tmp_path,
                                         edit_config=lambda c: c.update(edit)))
  assert culprit in message


def test_inert_fields_of_older_files_import(tmp_path):
  older = {'n_ctx': 32, 'task_specific_params': {'text-generation': {'max_length': 50}},
           'torch_dtype': 'float32', 'summary_type': 'cls_index', 'do_sample': True}
  model_settings(edited_copy(os.path.join(DATA, 'gpt2'), tmp_path,
                             edit_config=lambda c: c.update(older)))


def test_command_line_refuses_an_unknown_field_in_one_line(tmp_path):
  (tmp_path / 'hf').mkdir()
  hf_dir = edited_copy(os.path.join(DATA, 'llama'), tmp_path / 'hf',
                       edit_config=lambda c: c.update(new_attention_trick=1))
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={hf_dir}',
       f'--workdir={tmp_path / "out"}'], capture_output=True, text=True, check=False,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and 'new_attention_trick' in lines[0], result.stderr
  assert not os.path.exists(tmp_path / 'out' / 'checkpoints')

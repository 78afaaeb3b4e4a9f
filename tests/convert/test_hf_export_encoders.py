"""convert/encoder_export.py through hf_export.export_tensors: T5 (v1.0, v1.1), LED and
Longformer imported from the tiny fixtures (tests/data/hf, the import tests'), written back,
compared with the original file and imported again."""

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from longformer_jax.convert import encoder_export, hf, hf_export
from longformer_jax.convert.errors import ConversionError
from tests.support.import_task_configs import written_task_config
from tests.support.repo_paths import REPO_ROOT

HF_DATA = os.path.join(REPO_ROOT, 'tests', 'data', 'hf')
FIXTURES = {name: os.path.join(HF_DATA, name) for name in ('t5', 't5_v11', 'led', 'longformer')}
# Tensors a scale (T5's query, sqrt(d_kv) = sqrt(8)) or a fold (Longformer's token type 0 in
# the positions) is undone in, equal up to float32 rounding.
ROUNDED = ('.q.weight', 'position_embeddings.weight')


def exported(source: str, out, original: dict | None = None) -> dict:
  """The tensors `export_tensors` writes for the import of `source`, saved with the original
  config.json (dtype float32) in `out`."""
  with open(os.path.join(source, 'config.json')) as f:
    config = json.load(f)
  _, params = hf.load(source)
  tensors = hf_export.export_tensors(params, config, original)
  save_file(tensors, os.path.join(str(out), 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(str(out), 'config.json'), 'w') as f:
    json.dump(dict(config, dtype='float32'), f)
  return tensors


@pytest.mark.parametrize('name', sorted(FIXTURES))
def test_export_writes_the_original_tensors_and_imports_the_same(name, tmp_path):
  source = FIXTURES[name]
  original = load_file(os.path.join(source, 'model.safetensors'))
  kept = {k: original[k] for k in encoder_export.ORIGINAL_TENSORS.get(name, ())}
  tensors = exported(source, tmp_path, kept)
  assert set(tensors) == set(original)
  for key, value in tensors.items():
    assert value.dtype == np.float32 and value.shape == original[key].shape, key
    if key.endswith(ROUNDED):
      np.testing.assert_allclose(value, original[key], rtol=0, atol=1e-6, err_msg=key)
    else:
      np.testing.assert_array_equal(value, original[key], err_msg=key)

  (config_a, params_a), (config_b, params_b) = hf.load(source), hf.load(str(tmp_path))
  assert config_a == config_b
  leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(params_a)
  leaves_b, tree_b = jax.tree_util.tree_flatten_with_path(params_b)
  assert tree_a == tree_b
  rounded = {'t5': "['query']", 'longformer': "['position_embedding']"}.get(name)
  for (path, a), (_, b) in zip(leaves_a, leaves_b):
    where = jax.tree_util.keystr(path)
    if rounded and rounded in where:
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=where)
    else:
      np.testing.assert_array_equal(a, b, err_msg=where)


def test_longformer_without_the_original_writes_zero_types_and_the_same_model(tmp_path):
  """Without the original's token types, the type table and rows 0..pad are zeros; the
  positions read back exactly and every other tensor is the original's."""
  source = FIXTURES['longformer']
  tensors = exported(source, tmp_path)
  original = load_file(os.path.join(source, 'model.safetensors'))
  position_name, type_name = encoder_export.ORIGINAL_TENSORS['longformer']
  assert not tensors[type_name].any() and not tensors[position_name][:2].any()
  for key in set(original) - {position_name, type_name}:
    np.testing.assert_array_equal(tensors[key], original[key], err_msg=key)
  _, params_a = hf.load(source)
  _, params_b = hf.load(str(tmp_path))
  jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)


def test_t5_position_tables_that_differ_between_layers_are_refused():
  with open(os.path.join(FIXTURES['t5'], 'config.json')) as f:
    config = json.load(f)
  _, params = hf.load(FIXTURES['t5'])
  table = params['decoder_1']['self_attention']['relative_attention_bias']['embedding']
  params['decoder_1']['self_attention']['relative_attention_bias']['embedding'] = table + 1
  with pytest.raises(ConversionError, match="decoder layer 1's relative position bias"):
    hf_export.export_tensors(params, config)


def test_longformer_without_a_head_is_refused():
  """Parameters with neither the masked-LM head nor a task's (classifier, span: those
  export, tests/convert/test_hf_longformer_heads.py) are refused."""
  with open(os.path.join(FIXTURES['longformer'], 'config.json')) as f:
    config = json.load(f)
  _, params = hf.load(FIXTURES['longformer'])
  for scope in ('lm_head_dense', 'lm_head_norm', 'lm_head_bias'):
    del params[scope]
  with pytest.raises(ConversionError, match='none of the Longformer heads'):
    hf_export.export_tensors(params, config)


def test_the_t5_import_ties_the_layers_position_tables(tmp_path):
  """The fine-tuning config the T5 import writes keeps the layers' copies of the relative
  position table equal (train/tied_parameters.py), so the run writes back."""
  config = written_task_config(FIXTURES['t5'], tmp_path, 'seq2seq')
  assert config.optimizer.tied_parameters == 'relative_attention_bias'


# The task flags of the one-step runs (beyond those every case takes).
TASK_FLAGS = {'seq2seq': ['--config.data.target_len=16'], 'classification': [],
              'qa': ['--config.data.question_len=8']}
ARCHITECTURES = {'classification': 'LongformerForSequenceClassification',
                 'qa': 'LongformerForQuestionAnswering'}


@pytest.mark.slow
@pytest.mark.parametrize('name, task', [('led', 'seq2seq'), ('t5', 'seq2seq'),
                                        ('longformer', 'classification'), ('longformer', 'qa')])
def test_a_fine_tuned_run_is_written_back(name, task, tmp_path):
  """convert.hf --task=TASK, one train.py step, hf_export --workdir=RUN: the run's
  parameters (restored through its task) import again from the written directory (for T5,
  with its position tables, trained, still one per side; for the Longformer, with the
  classification or QA head its task trained, under transformers' class of that head)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  written_task_config(FIXTURES[name], tmp_path / 'import', task)
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  run, out = str(tmp_path / 'run'), str(tmp_path / 'out')
  result = subprocess.run(
      [sys.executable, 'train.py', f'--config={tmp_path / "import" / "import_config.py"}',
       f'--workdir={run}', '--config.train.num_steps=1', '--config.train.eval_every=0',
       '--config.data.batch_size=8', '--config.data.eval_batch_size=8',
       '--config.data.seq_len=32', '--config.optimizer.warmup_steps=0'] + TASK_FLAGS[task],
      cwd=REPO_ROOT, capture_output=True, text=True, check=False, env=env)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'model.safetensors' in hf_export.export(run, out)
  if task in ARCHITECTURES:
    with open(os.path.join(out, 'config.json')) as f:
      assert json.load(f)['architectures'] == [ARCHITECTURES[task]]
  _, trained = hf_export.restore_run(run)
  _, params = hf.load(out)
  # T5's query kernels are scaled back and forth, the Longformer's positions have token type
  # 0 subtracted and added: equal up to float32 rounding.
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                         jax.device_get(trained), params)
  _, imported = hf.load(FIXTURES[name])
  assert any(not np.array_equal(a, b) for a, b in zip(
      jax.tree_util.tree_leaves(jax.device_get(trained['encoder'])),
      jax.tree_util.tree_leaves(imported['encoder'])))

"""The Longformer's classification and QA heads (convert/longformer_heads.py), both ways.

References: transformers' own `LongformerForSequenceClassification` (3 labels) and
`LongformerForQuestionAnswering` on the tiny Longformer of tests/data/hf/longformer
(`longformer_cls`, `longformer_qa`, written by tools/make_hf_fixtures.py), run without a
`global_attention_mask`, so with the global flags transformers picks itself (recorded in
`global_attention_mask.npy`: token 0; QA: the tokens before the first separator). Only valid
positions of the QA logits are compared.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from longformer_jax.convert import encoder_export, hf, hf_export, longformer_heads
from longformer_jax.convert.errors import ConversionError
from longformer_jax.models.encoder import SequenceClassifier, SpanExtractor, encoder_context
from tests.support.import_task_configs import written_task_config
from tests.support.repo_paths import REPO_ROOT

MASKED_LM_DATA = os.path.join(REPO_ROOT, 'tests', 'data', 'hf', 'longformer')
HF_DATA = os.path.dirname(MASKED_LM_DATA)
FIXTURES = {'classification': os.path.join(HF_DATA, 'longformer_cls'),
            'qa': os.path.join(HF_DATA, 'longformer_qa')}
OUTPUTS = {'classification': ('logits',), 'qa': ('start_logits', 'end_logits')}
TOLERANCE = 1e-5


def fixture(task: str, name: str) -> np.ndarray:
  return np.load(os.path.join(FIXTURES[task], name))


def hf_config(source: str) -> dict:
  with open(os.path.join(source, 'config.json')) as f:
    return json.load(f)


def head_outputs(task: str, model, params, global_flags=None) -> dict:
  """Our model's outputs on the fixture's inputs (`global_flags`: the recorded ones)."""
  flags = fixture(task, 'global_attention_mask.npy') if global_flags is None else global_flags
  ctx = encoder_context(jnp.asarray(fixture(task, 'attention_mask.npy'), bool),
                        jnp.asarray(flags, bool), deterministic=True)
  out = model.apply({'params': params}, jnp.asarray(fixture(task, 'input_ids.npy')), ctx)
  return {name: np.asarray(value) for name, value in zip(OUTPUTS[task], out)}


def largest_difference(task: str, outputs: dict) -> float:
  valid = fixture(task, 'attention_mask.npy').astype(bool)
  worst = 0.0
  for name, ours in outputs.items():
    difference = np.abs(ours - fixture(task, f'{name}.npy'))
    worst = max(worst, float((difference if task == 'classification' else difference[valid]).max()))
  return worst


@pytest.mark.parametrize('task', sorted(FIXTURES))
def test_imported_heads_compute_transformers_logits(task):
  model, params = hf.load_model(FIXTURES[task])
  assert isinstance(model, SequenceClassifier if task == 'classification' else SpanExtractor)
  assert largest_difference(task, head_outputs(task, model, params)) <= TOLERANCE
  # The reference depends on the head and the global flags: a transposed head, or no
  # global tokens, moves the logits far past the tolerance.
  head = 'pooler' if task == 'classification' else 'span'
  kernel = params[head]['kernel']
  swapped = dict(params, **{head: dict(params[head], kernel=(
      kernel.T if kernel.shape[0] == kernel.shape[1] else -kernel))})
  assert largest_difference(task, head_outputs(task, model, swapped)) > 1e-2
  flags = np.zeros_like(fixture(task, 'global_attention_mask.npy'))
  assert largest_difference(task, head_outputs(task, model, params, flags)) > 1e-3


def test_transformers_global_flags_are_ours():
  """Classification: token 0 ([CLS]); QA: `<s>` and the question, before the first separator
  (our qa task also flags that separator)."""
  assert (fixture('classification', 'global_attention_mask.npy')
          == (np.arange(12) == 0)[None]).all()
  ids = fixture('qa', 'input_ids.npy')
  first_sep = np.argmax(ids == 2, axis=1)
  assert (fixture('qa', 'global_attention_mask.npy')
          == (np.arange(12)[None] < first_sep[:, None])).all()


def test_settings_and_labels_follow_the_checkpoint():
  model_config, params = hf.load(FIXTURES['classification'])
  assert model_config.num_classes == 3 and params['classifier']['kernel'].shape == (32, 3)
  model_config, params = hf.load(FIXTURES['qa'])
  assert model_config.num_classes == 0 and params['span']['kernel'].shape == (32, 2)


@pytest.mark.parametrize('task', sorted(FIXTURES))
def test_export_writes_the_fixture_and_imports_the_same(task, tmp_path):
  """import -> export -> import: the exported tensors and config.json are the fixture's (the
  positions, where token type 0 is folded in and out, up to float32 rounding), and the
  parameters imported again are the first import's."""
  source = FIXTURES[task]
  original = load_file(os.path.join(source, 'model.safetensors'))
  config = hf_config(source)
  kept = {k: original[k] for k in encoder_export.ORIGINAL_TENSORS['longformer']}
  _, params = hf.load(source)
  tensors = hf_export.export_tensors(params, config, kept)
  assert set(tensors) == set(original)
  for key, value in tensors.items():
    if key.endswith('position_embeddings.weight'):
      np.testing.assert_allclose(value, original[key], rtol=0, atol=1e-6, err_msg=key)
    else:
      np.testing.assert_array_equal(value, original[key], err_msg=key)
  written = encoder_export.exported_config(config, params)
  assert written == config
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file(tensors, os.path.join(str(tmp_path), 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(str(tmp_path), 'config.json'), 'w') as f:
    json.dump(written, f)
  (config_a, params_a), (config_b, params_b) = hf.load(source), hf.load(str(tmp_path))
  assert config_a == config_b
  assert jax.tree_util.tree_structure(params_a) == jax.tree_util.tree_structure(params_b)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params_a),
                          jax.tree_util.tree_leaves(params_b)):
    where = jax.tree_util.keystr(path)
    if 'position_embedding' in where:
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=where)
    else:
      np.testing.assert_array_equal(a, b, err_msg=where)


def test_the_config_names_the_head_of_the_parameters():
  """A run fine-tuned from the masked LM writes the architecture of its task's head and its
  number of labels; a masked LM keeps its config."""
  masked_lm = hf_config(MASKED_LM_DATA)
  _, params = hf.load(MASKED_LM_DATA)
  assert encoder_export.exported_config(masked_lm, params) == masked_lm
  classifier = {'embedding': {}, 'pooler': {}, 'classifier': {'bias': np.zeros(2)}}
  written = encoder_export.exported_config(masked_lm, classifier)
  assert written['architectures'] == [longformer_heads.CLASSIFICATION]
  assert longformer_heads.num_labels(written) == 2     # no id2label: transformers' default
  written = encoder_export.exported_config(masked_lm, {'pooler': {}, 'classifier': {
      'bias': np.zeros(5)}})
  assert written['id2label'] == {str(i): f'LABEL_{i}' for i in range(5)}
  assert written['label2id'] == {f'LABEL_{i}': i for i in range(5)}
  written = encoder_export.exported_config(hf_config(FIXTURES['classification']),
                                           {'span': {}})
  assert written['architectures'] == [longformer_heads.QA]
  assert longformer_heads.num_labels(written) == 2
  with pytest.raises(ConversionError, match='none of the Longformer heads'):
    encoder_export.exported_config(masked_lm, {'embedding': {}})


def test_a_qa_checkpoint_with_other_labels_is_refused(tmp_path):
  from tests.support.hf_checkpoints import conversion_error, edited_copy  # pylint: disable=g-import-not-at-top
  labels = {str(i): f'LABEL_{i}' for i in range(3)}
  message = conversion_error(edited_copy(FIXTURES['qa'], tmp_path,
                                         edit_config=lambda c: c.update(id2label=labels)))
  assert 'num_labels=3' in message


# ---- fine-tuning: convert.hf --task, train.init_from_hf keeps the checkpoint's head ------

def fresh_and_imported(config):
  """`(fresh state, state with train.init_from_hf's parameters)` of `config`'s task."""
  from longformer_jax.convert import hf_init  # pylint: disable=g-import-not-at-top
  from longformer_jax.data.tokenizers import make_tokenizer  # pylint: disable=g-import-not-at-top
  from longformer_jax.parallel.mesh import make_mesh  # pylint: disable=g-import-not-at-top
  from longformer_jax.tasks.registry import task_for  # pylint: disable=g-import-not-at-top
  from longformer_jax.train.example_state import abstract_task_state  # pylint: disable=g-import-not-at-top
  from longformer_jax.train.optimizer import make_optimizer  # pylint: disable=g-import-not-at-top
  task = task_for(config.task)
  _, model = task.model(config, make_tokenizer(config.data).vocab_size)
  seq_len = config.data.seq_len
  example = dict(inputs=np.zeros((2, seq_len), np.int32), input_mask=np.ones((2, seq_len), bool),
                 global_flags=np.zeros((2, seq_len), bool), label=np.zeros((2,), np.int32),
                 answer_mask=np.ones((2, seq_len), bool), answer_start=np.zeros((2,), np.int32),
                 answer_end=np.zeros((2,), np.int32), weight=np.ones((2,), np.float32))
  _, _, create_state = abstract_task_state(
      model, task.init_arguments, make_optimizer(config.optimizer, 10), 0, example,
      make_mesh(config.parallel.mesh_shape), config.parallel.logical_axis_rules)
  fresh = create_state(jax.random.PRNGKey(0))
  return fresh, hf_init.with_imported_params(config, fresh)


@pytest.mark.parametrize('task', sorted(FIXTURES))
def test_the_task_takes_the_checkpoints_head(task, tmp_path):
  config = written_task_config(FIXTURES[task], tmp_path, task)
  assert config.model.num_classes == (3 if task == 'classification' else 0)
  _, state = fresh_and_imported(config)
  _, reference = hf.load(FIXTURES[task])
  assert set(state.params) == set(reference)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(state.params),
                         reference)


def test_a_classifier_with_other_classes_is_refused_in_one_line(tmp_path):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from longformer_jax.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from longformer_jax.convert import hf_init  # pylint: disable=g-import-not-at-top
  config = written_task_config(FIXTURES['classification'], tmp_path, 'classification')
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.num_classes = 2
  with pytest.raises(ConfigError) as error:
    hf_init.imported(config)
  message = str(error.value)
  assert 'model.num_classes' in message and '2' in message and '3 labels' in message
  assert '\n' not in message


def test_a_qa_run_drops_a_classifier_checkpoints_head(tmp_path):
  config = written_task_config(FIXTURES['classification'], tmp_path, 'qa')
  fresh, state = fresh_and_imported(config)
  assert 'classifier' not in state.params and 'pooler' not in state.params
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(state.params['span']),
                         jax.device_get(fresh.params['span']))

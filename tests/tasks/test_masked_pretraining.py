"""Self-pretraining: task masked_pretraining (tasks/masked_pretraining.py) and a classifier
started from it (`train.init_from`, tasks/pretrained_encoder.py).

References: the loss against a numpy cross-entropy over the picked positions of the real
examples; the copied parameters against the pretraining run's own, leaf by leaf; train.py
runs of both stages on a tiny model.
"""

import copy
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import train as train_script
from configs import lra
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import token_masking
from longformer_jax.data.token_masking import mask_tokens
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.encoder import encoder_context
from longformer_jax.tasks import masked_pretraining, pretrained_encoder
from longformer_jax.tasks.example_training import ExampleTraining
from longformer_jax.tasks.registry import task_for
from longformer_jax.train.model_variables import ModelVariables
from tests.support.tiny_tasks import TOKENIZER, fit, tiny_task_config, trainable_task_config

TASK = task_for('masked_pretraining')


def test_loss_is_the_numpy_cross_entropy_at_the_picked_tokens_of_real_examples():
  config = tiny_task_config('masked_pretraining')
  config.data.masking.rate = 0.3
  arrays = TASK.load_arrays(config, 'train', TOKENIZER)
  batch = {name: jnp.asarray(value[:6]) for name, value in arrays.items()}
  batch['weight'] = batch['weight'].at[5].set(0.0)           # a padded example
  batch['input_mask'] = batch['input_mask'].at[:, 28:].set(False)   # and padding
  _, model = TASK.model(config, TOKENIZER.vocab_size)
  assert model.config.vocab_size >= TOKENIZER.vocab_size + 1          # [MASK] added
  params = model.init(jax.random.PRNGKey(0), *TASK.init_arguments(batch))['params']
  sums = TASK.sums_fn(config, model)(ModelVariables(params), batch, {}, True)

  # The evaluation key, drawn again here: the picks and the model's input.
  masked, picked = mask_tokens(
      jax.random.PRNGKey(token_masking.EVAL_MASK_SEED), batch['inputs'],
      masked_pretraining.maskable_tokens(batch, cls_token=True), rate=0.3, replace_mask=0.8,
      replace_random=0.1, mask_id=TOKENIZER.vocab_size, vocab_size=TOKENIZER.vocab_size)
  picked = np.asarray(picked)
  assert not picked[:, 0].any() and not picked[:, 28:].any()       # [CLS], padding: never
  logits, _ = model.apply({'params': params}, masked,
                          encoder_context(batch['input_mask'], batch['global_flags'], True))
  logits = np.asarray(logits, np.float64)
  log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                              keepdims=True))
  log_probs -= logits.max(-1, keepdims=True)
  counted = picked & (np.asarray(batch['weight'])[:, None] > 0)
  targets = np.asarray(batch['inputs'])
  nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  assert counted.sum() > 10 and picked[5].any()           # the padded example had picks
  np.testing.assert_allclose(float(sums['count']), counted.sum())
  np.testing.assert_allclose(float(sums['loss_sum']), nll[counted].sum(), rtol=1e-5)
  correct = (logits.argmax(-1) == targets)[counted].sum()
  np.testing.assert_allclose(float(sums['correct']), correct)
  assert float(sums['examples']) == 5


def test_training_masks_differ_from_step_to_step_and_evaluation_masks_do_not():
  one = masked_pretraining.masking_key({'dropout': jax.random.PRNGKey(1)})
  two = masked_pretraining.masking_key({'dropout': jax.random.PRNGKey(2)})
  assert (np.asarray(one) != np.asarray(two)).any()
  np.testing.assert_array_equal(masked_pretraining.masking_key({}),
                                masked_pretraining.masking_key({}))


@pytest.mark.parametrize('task, section, change', [
    ('classification', 'data.masking', lambda v: v['data'].update(masking={'rate': 0.3})),
    ('qa', 'train.init_from', lambda v: v['train'].update(init_from='/x')),
    ('masked_pretraining', 'model.num_classes',
     lambda v: v['model'].update(num_classes=2)),
])
def test_a_setting_the_task_does_not_read_names_the_key(task, section, change):
  values = trainable_task_config(task).to_dict()
  change(values)
  with pytest.raises(ConfigError) as error:
    resolve_config(values)
  assert error.value.key.startswith(section)


def test_lra_masked_config_is_the_classifier_without_its_head():
  masked = lra.get_config('pathfinder,vanilla,mini,masked')
  plain = lra.get_config('pathfinder,vanilla,mini')
  assert masked['task'] == 'masked_pretraining' and plain['task'] == 'classification'
  assert masked['data'] == plain['data'] and masked['optimizer'] == plain['optimizer']
  head = {'num_classes', 'pooling'}
  assert {k: v for k, v in plain['model'].items() if k not in head} == masked['model']
  resolve_config(masked)
  for bad in ('retrieval,vanilla,mini,masked', 'pathfinder,vanilla,mini,pretrained'):
    with pytest.raises(ConfigError) as error:
      lra.get_config(bad)
    assert error.value.key == '--config'


# ---- starting a classifier from it ---------------------------------------------------------

def fake_run(tmp_path, task: str, checkpoint: bool = True) -> str:
  workdir = tmp_path / task
  (workdir / 'checkpoints' / ('10' if checkpoint else 'tmp')).mkdir(parents=True)
  (workdir / 'config.json').write_text(json.dumps({'task': task}))
  return str(workdir)


def start_config(workdir: str) -> ml_collections.ConfigDict:
  config = trainable_task_config('classification')
  config.train.init_from = workdir
  return config


def test_init_from_refuses_what_is_not_a_checkpointed_pretraining_run(tmp_path):
  cases = [
      (str(tmp_path / 'missing'), 'no config.json'),
      (fake_run(tmp_path, 'classification'), "is a 'classification' run"),
      (fake_run(tmp_path, 'masked_pretraining', checkpoint=False), 'has no checkpoint'),
  ]
  for workdir, message in cases:
    with pytest.raises(ConfigError) as error:
      pretrained_encoder.check_init_from(start_config(workdir))
    assert error.value.key == 'train.init_from' and message in str(error.value)
  both = start_config(fake_run(tmp_path / 'b', 'masked_pretraining'))
  both.train.init_from_hf = '/somewhere'
  with pytest.raises(ConfigError, match='both set') as error:
    pretrained_encoder.check_init_from(both)
  pretrained_encoder.check_init_from(start_config(''))      # off: nothing checked


def test_encoder_params_copy_the_shared_scopes_and_cut_the_embedding_to_the_classifier():
  rng = np.random.default_rng(0)
  target = {'embedding': {'embedding': jnp.zeros((6, 4))},
            'encoder': {'w': jnp.zeros((4, 4))}, 'pooler': {'w': jnp.zeros((4, 4))}}
  source = {'embedding': {'embedding': jnp.asarray(rng.normal(size=(7, 4)))},
            'encoder': {'w': jnp.asarray(rng.normal(size=(4, 4)))},
            'lm_head_bias': jnp.zeros((7,))}
  taken = pretrained_encoder.encoder_params(source, target, 'W')
  assert set(taken) == {'embedding', 'encoder'}
  np.testing.assert_array_equal(taken['embedding']['embedding'],
                                source['embedding']['embedding'][:6])
  np.testing.assert_array_equal(taken['encoder']['w'], source['encoder']['w'])
  wider = dict(source, encoder={'w': jnp.zeros((4, 8))})
  with pytest.raises(ConfigError, match="'encoder' parameters of 'W' have other shapes"):
    pretrained_encoder.encoder_params(wider, target, 'W')
  with pytest.raises(ConfigError, match="no 'encoder' parameters"):
    pretrained_encoder.encoder_params({'embedding': source['embedding']}, target, 'W')


@pytest.mark.slow
def test_pretraining_then_a_classifier_from_it_through_train_py(tmp_path):
  pretrain_dir = str(tmp_path / 'pre')
  config = trainable_task_config('masked_pretraining')
  config.train.update(num_steps=2, checkpoint_every=2, eval_every=2, log_every=1)
  state, metrics = train_script.train(config, pretrain_dir)
  assert int(state.step) == 2 and metrics['final_valid']['tokens'] > 0
  pretrained = jax.device_get(state.params)

  config = start_config(pretrain_dir)
  config.seed = 1                  # a fresh encoder would differ from the pretrained one
  started = jax.device_get(ExampleTraining(task_for('classification'), config).fresh_state()
                           .params)
  np.testing.assert_array_equal(started['embedding']['embedding'],
                                pretrained['embedding']['embedding'][:len(
                                    started['embedding']['embedding'])])
  for new, old in zip(jax.tree_util.tree_leaves(started['encoder']),
                      jax.tree_util.tree_leaves(pretrained['encoder'])):
    np.testing.assert_array_equal(new, old)
  assert 'pooler' in started and 'lm_head_bias' not in started
  state, metrics = train_script.train(config, str(tmp_path / 'classifier'))
  assert int(state.step) == config.train.num_steps
  wider = copy.deepcopy(config)
  wider.model.d_ff = 2 * config.model.d_ff
  wider = ml_collections.ConfigDict(resolve_config(wider.to_dict()))
  with pytest.raises(ConfigError) as error:
    train_script.train(wider, str(tmp_path / 'never'))
  assert error.value.key == 'train.init_from'
  never = tmp_path / 'never' / 'checkpoints'
  assert not never.exists() or not [d for d in os.listdir(never) if d.isdigit()]


@pytest.mark.slow        # 150 steps of a 2-layer, d_model 32 encoder
def test_masked_pretraining_learns_the_letters():
  config = tiny_task_config('masked_pretraining')
  before, after = fit(config, 150)
  # The synthetic examples are random lowercase letters: a model that has learnt which bytes
  # occur predicts a masked one at ln 26 = 3.26 nats (the best possible), from about
  # ln 264 = 5.58 at the start.
  assert before['loss'] > 5.0 and after['loss'] < 4.0

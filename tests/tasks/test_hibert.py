"""HIBERT: the hierarchical encoder, masked sentence prediction, extractive head, tasks, configs.

References: each sentence encoded alone (against the batched path), the loss
with targets of unpicked sentences changed (against the original), masking
frequencies over many documents (against 80/10/10 and 15%), a numpy BCE, and
train.py / eval.py runs on tiny models over a text-file corpus written by
tests/tasks/conftest.py.
"""

import copy
import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from configs import hibert as hibert_config
from configs import hibert_extractive as extractive_config
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.hibert import HibertEncoder
from longformer_jax.tasks import hibert_masking, sentence_mask
from longformer_jax.tasks.registry import task_for
from longformer_jax.train.model_variables import ModelVariables

# Tiny programs: compile fast rather than run fast (as tests/support/fast_compile.py).
FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE)
TINY_MODEL = {'d_model': 32, 'num_heads': 2, 'head_dim': 16, 'd_ff': 64, 'dropout_rate': 0.0}
TINY_HIBERT = {'sentence_layers': 1, 'document_layers': 1, 'max_sentences': 6,
               'max_sentence_tokens': 12}


def tiny_config(task: str, corpus: str, **train) -> ml_collections.ConfigDict:
  """configs/hibert*.py with a tiny model on `corpus`, resolved as train.py does."""
  values = copy.deepcopy((hibert_config if task == 'sentence_mask' else extractive_config)
                         .get_config())
  values['model'].update(TINY_MODEL)
  values['model']['hibert'].update(TINY_HIBERT)
  values['data'].update(corpus=corpus, batch_size=8, eval_batch_size=8)
  values['train'].update(train)
  return ml_collections.ConfigDict(resolve_config(values))


def init_model(config):
  tokenizer = ByteTokenizer()
  _, model = task_for(config.task).model(config, tokenizer.vocab_size)
  arrays = task_for(config.task).load_arrays(config, 'train', tokenizer)
  batch = {name: jnp.asarray(value[:8]) for name, value in arrays.items()}
  params = jit(model.init)(jax.random.PRNGKey(1),
                               *task_for(config.task).init_arguments(batch))['params']
  return model, params, batch


# ---- the hierarchical encoder ---------------------------------------------------------------

def test_batched_sentence_encoder_equals_each_sentence_alone(corpus):
  config = tiny_config('extractive', corpus)
  model, _, batch = init_model(config)
  encoder = HibertEncoder(model.config)
  tokens = batch['sentences'][:3]
  token_mask = tokens != ByteTokenizer.pad_id
  params = jit(encoder.init, static_argnums=4)(
      jax.random.PRNGKey(2), tokens, token_mask, batch['sentence_mask'][:3], True)
  apply = jit(lambda t, m: encoder.apply(params, t, m, True,
                                             method=HibertEncoder.encode_sentences)[0])
  batched = np.asarray(apply(tokens, token_mask))
  mask = np.asarray(batch['sentence_mask'][:3])
  for b, s in zip(*np.nonzero(mask)):
    alone = np.asarray(apply(tokens[b:b + 1, s:s + 1], token_mask[b:b + 1, s:s + 1]))
    np.testing.assert_allclose(batched[b, s], alone[0, 0], atol=2e-5)
  # A sentence's vector depends on its own tokens only (so the check above can fail).
  changed = tokens.at[0, 0, 1].set((tokens[0, 0, 1] + 1) % 256)
  other = np.asarray(apply(changed, token_mask))
  assert np.abs(other[0, 0] - batched[0, 0]).max() > 1e-5
  np.testing.assert_allclose(other[0, 1:], batched[0, 1:], atol=1e-6)


# ---- masking -------------------------------------------------------------------------------

def test_masking_is_80_10_10_of_15_percent_of_sentences():
  b, s, t, mask_id = 1500, 20, 5, 999
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(np.concatenate([np.full((b, s, 1), 7), rng.integers(0, 256, (b, s, t - 1))],
                                      -1), jnp.int32)
  token_mask = jnp.ones((b, s, t), bool).at[:, :, -1].set(False)
  tokens = jnp.where(token_mask, tokens, 500)
  sentence_mask = jnp.ones((b, s), bool).at[:, -2:].set(False)         # 18 real sentences
  out = jit(functools.partial(
      hibert_masking.mask_sentences, mask_rate=0.15, replace_mask=0.8, replace_random=0.1,
      max_predictions=3, mask_id=mask_id))(
          jax.random.PRNGKey(3), tokens, token_mask, sentence_mask, jnp.arange(b))
  action = np.asarray(out['action'])
  picked = action != hibert_masking.KEEP
  np.testing.assert_array_equal(picked.sum(1), 3)                        # ceil(0.15 * 18)
  assert not picked[:, -2:].any()                                        # never padding
  per_position = picked[:, :18].mean(0)
  assert np.abs(per_position - 3 / 18).max() < 0.04                     # uniform picks
  fractions = [np.mean(action[picked] == a) for a in (1, 2, 3)]
  np.testing.assert_allclose(fractions, [0.8, 0.1, 0.1], atol=0.02)
  new, old = np.asarray(out['tokens']), np.asarray(tokens)
  masked = action == hibert_masking.MASK
  assert (new[masked][:, 0] == 7).all() and (new[masked][:, 1:-1] == mask_id).all()
  assert (new[masked][:, -1] == 500).all()                               # padding stays
  kept = (action == hibert_masking.KEEP) | (action == hibert_masking.UNCHANGED)
  np.testing.assert_array_equal(new[kept], old[kept])
  randomised = action == hibert_masking.RANDOM
  flat = {tuple(row) for row in old[:, :18].reshape(-1, t)}
  assert all(tuple(row) in flat for row in new[randomised])
  assert np.mean([tuple(r) != tuple(o) for r, o in zip(new[randomised], old[randomised])]) > 0.95
  positions, slot_valid = np.asarray(out['positions']), np.asarray(out['slot_valid'])
  assert slot_valid.all()
  np.testing.assert_array_equal(np.sort(positions, 1), np.sort(np.nonzero(picked)[1].reshape(b, 3), 1))


def test_masking_depends_on_the_key_and_example_not_the_batch():
  tokens = jnp.tile(jnp.arange(8, dtype=jnp.int32)[None, :, None], (4, 1, 3))
  args = dict(mask_rate=0.3, replace_mask=0.8, replace_random=0.1, max_predictions=3, mask_id=99)
  masker = jit(functools.partial(hibert_masking.mask_sentences, **args))
  run = lambda key, x, idx: np.asarray(masker(
      key, x, jnp.ones(x.shape, bool), jnp.ones(x.shape[:2], bool), idx)['positions'])
  key = jax.random.PRNGKey(5)
  full = run(key, tokens, jnp.arange(4))
  np.testing.assert_array_equal(full, run(key, tokens, jnp.arange(4)))
  np.testing.assert_array_equal(full[2:], run(key, tokens[2:], jnp.arange(2, 4)))
  assert not np.array_equal(full, run(jax.random.PRNGKey(6), tokens, jnp.arange(4)))


# ---- the masked-sentence loss reaches only masked sentences --------------------------------

def test_sentence_mask_loss_reaches_only_the_picked_sentences(corpus):
  config = tiny_config('sentence_mask', corpus)
  model, params, batch = init_model(config)
  task_sums = task_for(config.task).sums_fn(config, model)
  sums_fn = jit(lambda p, b: task_sums(ModelVariables(p), b, {}, True))
  base = sums_fn(params, batch)
  tokens = batch['sentences']
  picked = hibert_masking.mask_sentences(
      sentence_mask.masking_key({}), tokens, tokens != ByteTokenizer.pad_id,
      batch['sentence_mask'], batch['example_index'], mask_rate=0.15, replace_mask=0.8,
      replace_random=0.1, max_predictions=1, mask_id=ByteTokenizer.vocab_size)['action'] != 0
  picked = np.asarray(picked)
  real = np.asarray(batch['sentence_mask'])
  assert picked.sum() == 8 and (picked <= real).all()
  # Every real sentence that was not picked: its targets changed -> the same loss.
  targets = np.asarray(batch['targets']).copy()
  targets[real & ~picked] = (targets[real & ~picked] + 3) % 256
  changed = sums_fn(params, dict(batch, targets=jnp.asarray(targets)))
  assert float(changed['loss_sum']) == pytest.approx(float(base['loss_sum']), rel=1e-6)
  assert float(changed['count']) == float(base['count'])
  # ... and the gradient of the loss w.r.t. unpicked targets' logits is zero, picked non-zero.
  targets = np.asarray(batch['targets']).copy()
  b, s = np.argwhere(picked)[0]
  targets[b, s, 0] = (targets[b, s, 0] + 3) % 256
  assert float(sums_fn(params, dict(batch, targets=jnp.asarray(targets)))['loss_sum']) != \
      pytest.approx(float(base['loss_sum']), rel=1e-6)
  # The count is the picked sentences' target tokens (EOS included).
  want = sum(int((np.asarray(batch['targets'])[b, s] != ByteTokenizer.pad_id).sum())
             for b, s in np.argwhere(picked))
  assert float(base['count']) == want
  metrics = task_for('sentence_mask').metrics(jax.tree_util.tree_map(float, base))
  assert 0 <= metrics['token_accuracy'] <= 1 and metrics['tokens'] == want


def test_extractive_loss_is_the_numpy_bce_over_real_sentences(corpus):
  config = tiny_config('extractive', corpus)
  model, params, batch = init_model(config)
  batch = dict(batch, weight=jnp.asarray([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32))
  sums = task_for(config.task).sums_fn(config, model)(ModelVariables(params), batch, {}, True)
  tokens = batch['sentences']
  logits, _ = model.apply({'params': params}, tokens, tokens != ByteTokenizer.pad_id,
                          batch['sentence_mask'], True)
  z, y = np.asarray(logits, np.float64), np.asarray(batch['labels'], np.float64)
  mask = np.asarray(batch['sentence_mask']) & (np.asarray(batch['weight'])[:, None] > 0)
  p = 1 / (1 + np.exp(-z))
  bce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
  metrics = task_for('extractive').metrics(jax.tree_util.tree_map(float, sums))
  np.testing.assert_allclose(metrics['loss'], bce[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics['label_accuracy'], ((z > 0) == (y > 0.5))[mask].mean())
  assert metrics['sentences'] == mask.sum() and metrics['examples'] == 6


# ---- config errors -------------------------------------------------------------------------

@pytest.mark.parametrize('key,change', [
    ('model.hibert.mask_rate', lambda v: v['model']['hibert'].update(mask_rate=0.0)),
    ('model.hibert.max_sentences', lambda v: v['model']['hibert'].update(max_sentences=1)),
    ('model.hibert.replace_random',
     lambda v: v['model']['hibert'].update(replace_mask=0.95, replace_random=0.1)),
    ('model.hibert.init_from', lambda v: v['model']['hibert'].update(init_from='/x')),
    ('model.hibert.sentnce_layers', lambda v: v['model']['hibert'].update(sentnce_layers=2)),
    ('model.num_layers', lambda v: v['model'].update(num_layers=3)),
    ('data.seq_len', lambda v: v['data'].update(seq_len=128)),
    ('model.hibert.max_sentences',
     lambda v: (v.update(task='lm'), v['model']['hibert'].update(max_sentences=8))),
])
def test_bad_pretraining_settings_name_the_key(key, change):
  values = copy.deepcopy(hibert_config.get_config())
  change(values)
  with pytest.raises(ConfigError) as error:
    resolve_config(values)
  assert error.value.key == key and '\n' not in str(error.value)


def test_bad_extractive_settings_name_the_key():
  values = extractive_config.get_config()
  values['model']['hibert']['decoder_layers'] = 2
  with pytest.raises(ConfigError) as error:
    resolve_config(values)
  assert error.value.key == 'model.hibert.decoder_layers'


# ---- train.py and eval.py ------------------------------------------------------------------

@pytest.mark.slow
def test_two_pretraining_steps_through_train_py(corpus, tmp_path):
  config = tiny_config('sentence_mask', corpus, num_steps=2, log_every=1, eval_every=0,
                       checkpoint_every=2, async_checkpointing=False)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 2 and metrics['step'] == 2
  lines = [json.loads(line) for line in open(os.path.join(tmp_path, 'metrics.jsonl'))]
  train_lines = [line for line in lines if line['split'] == 'train']
  assert [line['step'] for line in train_lines] == [1, 2]
  assert all(np.isfinite(line['loss']) and 0 <= line['token_accuracy'] <= 1 for line in train_lines)


@pytest.mark.slow
def test_pretrain_then_finetune_through_train_and_eval(corpus, tmp_path, capsys):
  pretrain_dir, finetune_dir = str(tmp_path / 'pre'), str(tmp_path / 'ext')
  config = tiny_config('sentence_mask', corpus, num_steps=2, log_every=1, eval_every=2,
                       checkpoint_every=2, async_checkpointing=False)
  state, metrics = train_script.train(config, pretrain_dir)
  assert int(state.step) == 2
  valid = metrics['final_valid']
  assert valid['examples'] == 4 and valid['tokens'] > 0 and 0 <= valid['token_accuracy'] <= 1
  lines = [json.loads(line) for line in open(os.path.join(pretrain_dir, 'metrics.jsonl'))]
  assert [line['step'] for line in lines if line['split'] == 'train'] == [1, 2]
  pretrained = state.params['hibert']

  config = tiny_config('extractive', corpus, num_steps=2, log_every=1, eval_every=2,
                       checkpoint_every=2, async_checkpointing=False)
  missing = copy.deepcopy(config)
  missing.model.hibert.init_from = str(tmp_path / 'nothing')
  with pytest.raises(ConfigError) as error:
    train_script.train(missing, str(tmp_path / 'never'))
  assert error.value.key == 'model.hibert.init_from'
  config.model.hibert.init_from = pretrain_dir
  config.seed = 1                        # a fresh encoder would differ from the pretrained one
  state, metrics = train_script.train(config, finetune_dir)
  # Two warm-up steps (learning rate <= 2e-5) move the copied encoder by far less than the
  # distance between two initialisations: the fine-tuning started from the pretrained encoder.
  moved = max(float(np.abs(np.asarray(new) - np.asarray(old)).max()) for new, old in zip(
      jax.tree_util.tree_leaves(state.params['hibert']), jax.tree_util.tree_leaves(pretrained)))
  assert moved < 2e-3
  valid = metrics['final_valid']
  assert valid['examples'] == 4 and 0 <= valid['label_accuracy'] <= 1
  assert 0 <= valid['rouge1'] <= 1 and 0 <= valid['rougeL'] <= 1
  config.eval.split = 'test'
  result = eval_script.evaluate_run(config, finetune_dir)
  assert result['examples'] == 4 and 0 <= result['rouge2'] <= 1
  assert '| ROUGE-1 | ROUGE-2 | ROUGE-L | label accuracy | loss | examples |' in \
      capsys.readouterr().out

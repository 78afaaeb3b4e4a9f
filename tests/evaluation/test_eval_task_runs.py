"""eval.py on every kind of run: classification, seq2seq (ROUGE of greedy decoding), LM reports."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.evaluation.greedy_decoding import greedy_decode, until_eos
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import decoder_context
from longformer_jax.tasks.registry import task_for
from tests.support.tiny_models import tiny_config
from tests.support.tiny_tasks import tiny_task_config, trainable_task_config

TOKENIZER = ByteTokenizer()


def trained_task(task: str, workdir: str):
  config = trainable_task_config(task)
  config.train.update(num_steps=2, checkpoint_every=2, eval_every=0)
  config.eval.split = 'valid'
  train_script.train(config, workdir)
  return config


def test_classification_eval_reports_accuracy(tmp_path, capsys):
  config = trained_task('classification', str(tmp_path))
  result = eval_script.evaluate_run(config, str(tmp_path))
  saved = json.load(open(tmp_path / 'eval' / 'metrics.json'))
  assert saved == result and result['checkpoint_step'] == 2
  assert 0 <= result['accuracy'] <= 1 and result['examples'] == 512
  assert '| accuracy | loss | examples |' in capsys.readouterr().out


@pytest.mark.slow
def test_seq2seq_eval_reports_rouge_of_greedy_decoding(tmp_path, capsys):
  config = trained_task('seq2seq', str(tmp_path))
  config.data.max_examples = 16
  result = eval_script.evaluate_run(config, str(tmp_path))
  for name in ('rouge1', 'rouge2', 'rougeL', 'token_accuracy'):
    assert 0 <= result[name] <= 1
  assert '| ROUGE-1 | ROUGE-2 | ROUGE-L |' in capsys.readouterr().out


def test_greedy_decoding_feeds_back_its_own_predictions():
  config = tiny_task_config('seq2seq')
  _, model = task_for(config.task).model(config, TOKENIZER.vocab_size)
  arrays = task_for('seq2seq').load_arrays(config, 'valid', TOKENIZER)
  batch = {name: jnp.asarray(value[:4]) for name, value in arrays.items()}
  params = model.init(jax.random.PRNGKey(0),
                      *task_for('seq2seq').init_arguments(batch))['params']
  predicted = np.asarray(greedy_decode(model, params, batch, TOKENIZER.bos_id, TOKENIZER.pad_id))
  # Teacher forcing on [BOS, predictions[:-1]] must reproduce the predictions.
  fed = np.concatenate([np.full((4, 1), TOKENIZER.bos_id), predicted[:, :-1]], axis=1)
  logits, _ = model.apply(
      {'params': params}, batch['inputs'],
      encoder_context(batch['input_mask'], batch['global_flags'], True), jnp.asarray(fed),
      decoder_context(jnp.ones(fed.shape, bool), True))
  np.testing.assert_array_equal(np.argmax(np.asarray(logits), axis=-1), predicted)


def test_until_eos_cuts_at_the_first_eos():
  np.testing.assert_array_equal(until_eos(np.array([5, 6, 9, 7, 9]), 9), [5, 6])
  np.testing.assert_array_equal(until_eos(np.array([5, 6]), 9), [5, 6])


@pytest.fixture(scope='module')
def lm_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('lm'))
  config = tiny_config(attention='xl')
  config.train.update(num_steps=2, checkpoint_every=2, eval_every=0)
  config.eval.max_tokens = 512
  train_script.train(config, workdir)
  return workdir, config


def test_lm_eval_leaves_no_stale_plot(lm_run, capsys):
  workdir, config = lm_run
  config.eval.mem_lens = '0,16'
  eval_script.evaluate_run(config, workdir)
  plot = os.path.join(workdir, 'eval', 'bits_per_byte_vs_mem_len.png')
  assert os.path.exists(plot)
  config.eval.mem_lens = '16'
  eval_script.evaluate_run(config, workdir)
  assert not os.path.exists(plot)
  out = capsys.readouterr().out
  assert 'trained: xl attention (mem_len 16)' in out
  assert '| xl attention (mem_len 16) |' in out

"""Longformer encoder tasks: classification and QA data, heads, metrics, training, configs.

References: spans and F1 against brute-force Python loops; labels and answers
of the built-in tasks against independent re-derivations from the source
files; training on tiny synthetic tasks that need the content (a planted
letter; a question word to find among two).
"""

import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import train as train_script
from configs import led, longformer_classification, longformer_lm, longformer_qa
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config, validate_config
from longformer_jax.data import classification_tasks, qa_tasks, stdlib_corpus
from longformer_jax.data.task_batches import TaskBatches, eval_batches
from longformer_jax.models.encoder import encoder_context
from longformer_jax.tasks import qa
from longformer_jax.tasks.registry import task_for
from tests.support.tiny_models import tiny_config
from tests.support.tiny_tasks import (TOKENIZER, VALID_SEQ_LEN, fit, tiny_task_config,
                                      trainable_task_config)


# ---- data -------------------------------------------------------------------


def test_stdlib_classification_labels_are_top_level_class_statements():
  texts = classification_tasks.stdlib_has_class_texts('valid', 255)
  positives = sum(label for _, label in texts)
  assert positives > 10 and positives * 2 == len(texts)        # balanced
  first_half = [label for _, label in texts[:len(texts) // 2]]
  assert 0.3 < np.mean(first_half) < 0.7                       # and shuffled
  for text, label in texts:
    lines = text.split(b'\n')
    has_class = any(line.startswith(b'class ') and len(line) > 6 and
                    (line[6:7].isalnum() or line[6:7] == b'_') for line in lines)
    assert label == int(has_class)
    assert 0 < len(text) <= 255


def test_classification_arrays_put_cls_first_and_only_it_global():
  examples = [classification_tasks.ClassificationExample(np.arange(5, dtype=np.int32), 1),
              classification_tasks.ClassificationExample(np.arange(40, dtype=np.int32), 0)]
  arrays = classification_tasks.classification_arrays(examples, 8, cls_id=257, pad_id=256)
  np.testing.assert_array_equal(arrays['inputs'][0], [257, 0, 1, 2, 3, 4, 256, 256])
  np.testing.assert_array_equal(arrays['inputs'][1], [257, 0, 1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(arrays['input_mask'][0], [1] * 6 + [0, 0])
  assert arrays['global_flags'].sum() == 2 and arrays['global_flags'][:, 0].all()
  np.testing.assert_array_equal(arrays['label'], [1, 0])


def test_stdlib_qa_answers_are_the_documented_function_names():
  texts = qa_tasks.stdlib_docstring_texts('valid', 200, 40)
  assert len(texts) > 20
  sources = {doc.name: doc.data for doc in stdlib_corpus.load_documents('valid')}
  for text in texts[:200]:
    # The excerpt may begin inside the `def` keyword.
    assert re.search(rb'(?:def\s+|ef\s+|f\s+|^\s*)$', text.before), text.before[-20:]
    assert re.fullmatch(rb'[A-Za-z_]\w*', text.answer)
    assert len(text.before) + len(text.answer) + len(text.after) <= 200
    # Independent check: some file defines this name, its docstring line follows the def.
    probe = text.question[:16]
    if re.search(rb'[^ -~]|\\', probe):
      continue                      # escapes in the source would differ from the docstring value
    assert any(re.search(rb'def\s+' + re.escape(text.answer) + rb'\b[\s\S]{0,3000}?' + re.escape(probe),
                         data) for data in sources.values()), text.answer


def test_qa_arrays_point_at_the_answer_and_flag_the_question_global():
  texts = qa_tasks.synthetic_texts(20, 27, seed=3)
  arrays = qa_tasks.qa_arrays(texts, TOKENIZER, seq_len=32, question_len=3)
  assert len(arrays['inputs']) == 20
  for row, text in enumerate(texts):
    start, end = arrays['answer_start'][row], arrays['answer_end'][row]
    assert TOKENIZER.decode_bytes(arrays['inputs'][row, start:end + 1]) == text.answer
    assert TOKENIZER.decode_bytes(arrays['inputs'][row, 1:4]) == text.question
    np.testing.assert_array_equal(np.flatnonzero(arrays['global_flags'][row]), [0, 1, 2, 3, 4])
    assert arrays['inputs'][row, 0] == TOKENIZER.bos_id and arrays['inputs'][row, 4] == TOKENIZER.eos_id
    np.testing.assert_array_equal(np.flatnonzero(arrays['answer_mask'][row]), np.arange(5, 32))


def test_qa_arrays_drop_answers_beyond_the_sequence():
  text = qa_tasks.QAText(b'q', b'x' * 40, b'ans', b'')
  assert len(qa_tasks.qa_arrays([text], TOKENIZER, seq_len=32, question_len=3)['inputs']) == 0


def test_task_batches_are_epochs_of_each_example_once_and_resume():
  arrays = {'x': np.arange(10), 'weight': np.ones(10, np.float32)}
  batches = TaskBatches(arrays, batch_size=4, seed=0)
  seen = np.concatenate([batches.next_batch()['x'] for _ in range(5)])   # two epochs
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
  resumed = TaskBatches(arrays, batch_size=4, seed=0)
  resumed.restore(batches.state())
  np.testing.assert_array_equal(resumed.next_batch()['x'], batches.next_batch()['x'])
  padded = list(eval_batches(arrays, 4))
  assert [b['weight'].sum() for b in padded] == [4, 4, 2]


# ---- metrics ------------------------------------------------------------------


def test_best_spans_equals_brute_force():
  rng = np.random.default_rng(0)
  start, end = rng.normal(size=(2, 6, 20)).astype(np.float32)
  allowed = rng.random((6, 20)) < 0.7
  allowed[:, 0] = True
  got_start, got_end = qa.best_spans(start, end, allowed, max_answer_len=4)
  for b in range(6):
    candidates = [(start[b, s] + end[b, e], s, e) for s in range(20) for e in range(s, min(s + 4, 20))
                  if allowed[b, s] and allowed[b, e]]
    _, s, e = max(candidates)
    assert (int(got_start[b]), int(got_end[b])) == (s, e)


def test_span_f1_is_the_f1_of_token_sets():
  rng = np.random.default_rng(1)
  spans = np.sort(rng.integers(0, 12, (200, 2, 2)), axis=-1)
  got = qa.span_f1(spans[:, 0, 0], spans[:, 0, 1], spans[:, 1, 0], spans[:, 1, 1])
  for (pred, gold), value in zip(spans, np.asarray(got)):
    p, g = set(range(pred[0], pred[1] + 1)), set(range(gold[0], gold[1] + 1))
    common = len(p & g)
    expected = 0.0 if not common else 2 * common / (len(p) + len(g))
    np.testing.assert_allclose(value, expected, rtol=1e-6)


# ---- models ---------------------------------------------------------------------


def test_encoder_is_bidirectional_and_passes_global_flags_to_attention():
  config = tiny_task_config('classification')
  _, model = task_for(config.task).model(config, TOKENIZER.vocab_size)
  arrays = classification_tasks.classification_arrays(
      [classification_tasks.ClassificationExample(np.arange(20, dtype=np.int32), 0)] * 2,
      32, TOKENIZER.bos_id, TOKENIZER.pad_id)
  ctx = encoder_context(jnp.asarray(arrays['input_mask']), jnp.asarray(arrays['global_flags']), True)
  params = model.init(jax.random.PRNGKey(0), arrays['inputs'], ctx)['params']
  seen_flags = []

  def record(next_fun, args, kwargs, context):
    if context.method_name == '__call__' and type(context.module).__name__ in ('VanillaAttention',):
      seen_flags.append(np.asarray(args[2].global_flags))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    logits, _ = model.apply({'params': params}, arrays['inputs'], ctx)
  assert len(seen_flags) == 2
  for flags in seen_flags:
    np.testing.assert_array_equal(flags, arrays['global_flags'])
  # The [CLS] logits depend on the last real token (no causal mask) but not on padding.
  changed = arrays['inputs'].copy()
  changed[1, 20] = 7
  padded = arrays['inputs'].copy()
  padded[1, 25] = 9
  apply = jax.jit(lambda tokens: model.apply({'params': params}, tokens, ctx)[0])
  changed_logits, padded_logits = apply(changed), apply(padded)
  assert not np.allclose(changed_logits[1], logits[1])
  np.testing.assert_allclose(padded_logits, logits, rtol=1e-6, atol=1e-6)


# ---- training ---------------------------------------------------------------------


@pytest.mark.slow       # 80 steps; the heads' losses are checked against numpy above
def test_classifier_learns_the_synthetic_task():
  before, after = fit(tiny_task_config('classification'), 80)
  assert after['loss'] < 0.3 * before['loss']
  assert after['accuracy'] > 0.9


@pytest.mark.slow       # 300 steps
def test_span_extractor_learns_the_synthetic_task():
  before, after = fit(tiny_task_config('qa'), 300)
  assert after['loss'] < 0.75 * before['loss']
  assert after['span_f1'] > 0.25 > before['span_f1'] + 0.05


@pytest.mark.slow
def test_classification_through_train_py_logs_accuracy_and_resumes(tmp_path):
  config = trainable_task_config('classification')
  config.train.update(num_steps=8, eval_every=4, log_every=2, checkpoint_every=4,
                      stop_after_steps=4)
  workdir = str(tmp_path)
  first, _ = train_script.train(config, workdir)
  assert int(first.step) == 4
  config.train.stop_after_steps = 0
  state, metrics = train_script.train(config, workdir)
  assert int(state.step) == 8 and metrics['step'] == 8
  lines = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  valid = [line for line in lines if line['split'] == 'valid']
  assert [line['step'] for line in valid] == [4, 8]
  assert all(line['examples'] == 256 and 0 <= line['accuracy'] <= 1 for line in valid)
  assert metrics['final_valid']['accuracy'] == valid[-1]['accuracy']
  assert [line['step'] for line in lines if line['split'] == 'train'] == [2, 4, 6, 8]
  # The resumed run continued the data where the first stopped: 8 steps of batches.
  with open(os.path.join(workdir, 'checkpoints', '8', 'data', 'metadata')) as f:
    assert json.load(f)['step'] == 8


@pytest.mark.parametrize('key,overrides', [
    ('task', {'task': 'translation'}),
    ('data.question_len', {'task': 'qa', 'data.question_len': VALID_SEQ_LEN - 2}),
    ('data.corpus', {'data.corpus': 'imdb'}),
    ('model.num_classes', {'model.num_classes': 1}),
])
def test_bad_task_config_names_the_key(tmp_path, key, overrides):
  config = trainable_task_config('classification')
  for dotted, value in overrides.items():
    if '.' in dotted:
      section, name = dotted.split('.')
      config[section][name] = value
    else:
      config[dotted] = value
  with pytest.raises(ConfigError) as error:
    train_script.train(config, str(tmp_path))
  assert error.value.key == key


# ---- configs and the per-layer window schedule ---------------------------------------


@pytest.mark.parametrize('module', [longformer_classification, longformer_qa, led, longformer_lm])
def test_configs_validate_and_build(module):
  config = ml_collections.ConfigDict(resolve_config(module.get_config()))
  validate_config(config)
  if config.task != 'lm':
    _, model = task_for(config.task).model(config, TOKENIZER.vocab_size)
    batch = {name: jnp.zeros((2,) + shape, dtype) for name, (shape, dtype) in {
        'inputs': ((config.data.seq_len,), jnp.int32),
        'input_mask': ((config.data.seq_len,), bool),
        'global_flags': ((config.data.seq_len,), bool),
        'decoder_inputs': ((config.data.target_len,), jnp.int32),
        'decoder_mask': ((config.data.target_len,), bool)}.items()}
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *task_for(config.task).init_arguments(
        batch)))
    assert jax.tree_util.tree_leaves(shapes)


def test_layer_schedule_gives_each_layer_its_window():
  """Layer windows 2,4,16 (one-sided): a key 8 tokens away moves only layer 2's attention."""
  config = tiny_config(attention='longformer', mem_len=0, num_layers=3, window=2, causal=False)
  config.model.layer_schedule = {'longformer': {'window': '2,4,16'}}
  from longformer_jax.models.decoder_lm import DecoderLM
  from longformer_jax.models.resolved_model import lm_model_config
  model_config = lm_model_config(config.model, TOKENIZER.vocab_size)
  model = DecoderLM(model_config)
  batch = 2, 32
  tokens = np.random.default_rng(0).integers(0, 256, batch).astype(np.int32)
  positions = np.tile(np.arange(32, dtype=np.int32), (2, 1))
  from longformer_jax.attention.context import AttentionContext
  ctx = AttentionContext(positions=positions, segment_ids=np.zeros_like(positions),
                         reset=np.ones(2, bool), valid=np.ones(batch, bool),
                         global_flags=np.zeros(batch, bool))
  states = DecoderLM.init_state(model_config, 2)
  params = model.init(jax.random.PRNGKey(0), tokens, states, ctx)['params']
  windows, inputs, outputs, bumped = [], [], [], []
  is_attention = lambda context: (context.method_name == '__call__' and
                                  type(context.module).__name__ == 'LongformerAttention')

  def record(next_fun, args, kwargs, context):
    """Each attention layer's window, input and output."""
    if not is_attention(context):
      return next_fun(*args, **kwargs)
    windows.append(context.module.config.window)
    inputs.append(args[0])
    out = next_fun(*args, **kwargs)
    outputs.append(out[0])
    return out

  def bump_key_12(next_fun, args, kwargs, context):
    """Each attention layer again, on its recorded input with token 12 changed."""
    if not is_attention(context):
      return next_fun(*args, **kwargs)
    out = next_fun(inputs[len(bumped)].at[:, 12].add(1.0), *args[1:], **kwargs)
    bumped.append(out[0])
    return out

  for interceptor in (record, bump_key_12):
    with nn.intercept_methods(interceptor):
      model.apply({'params': params}, tokens, states, ctx)
  moved = [not np.allclose(a[:, 4], b[:, 4]) for a, b in zip(outputs, bumped)]
  assert windows == [2, 4, 16]
  assert moved == [False, False, True]

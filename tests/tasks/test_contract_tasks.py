"""Every registered task keeps the task contract (longformer_jax/tasks/base.py).

Parametrised over `tasks/registry.TASKS`, so a task is covered once it is
registered (and fails here until `TINY` below gives it a tiny config and one
bad value of its own). Each task, on a 1-layer, d_model 32 model and tiny data
(the synthetic tasks, the built-in digits, or text files this module writes):

- the config checks accept the tiny config, and reject the task's bad value
  with a `ConfigError` naming its key;
- its training task builds (data, model), the state initialises, and one
  train step's sums (what the step returns) are all finite;
- the step's metrics (the task's `metrics`) hold `loss` and every report
  column of the task (`columns`, less the `extra_metrics` its report adds).

And no code outside `longformer_jax/tasks/` switches on a task's name.
"""

import copy
import math
import pathlib
import re

import jax
import ml_collections
import numpy as np
import pytest

from configs import hibert as hibert_config
from configs import hibert_extractive, image_digits
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.tasks.registry import TASKS, task_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = '<corpus>'          # replaced by the text-file corpus this module writes
TINY_MODEL = {'num_layers': 1, 'd_model': 32, 'num_heads': 2, 'head_dim': 16, 'd_ff': 64,
              'vocab_multiple': 8, 'dropout_rate': 0.0}
TINY_HIBERT = {'sentence_layers': 1, 'document_layers': 1, 'max_sentences': 6,
               'max_sentence_tokens': 12}
BATCH = {'batch_size': 8, 'eval_batch_size': 8}
SYNTHETIC = dict(BATCH, corpus='synthetic', seq_len=32, max_examples=16)
HIBERT_MODEL = {k: v for k, v in TINY_MODEL.items() if k != 'num_layers'}

# Per task: `(values, (key, bad values))`: its tiny config (sparse, as a config file) and an
# edit that only this task's checks reject, naming `key`.
TINY = {
    'lm': ({'data': dict(BATCH, corpus=CORPUS, chunk_len=8), 'model': dict(TINY_MODEL)},
           ('train.eval_max_examples', {'train': {'eval_max_examples': 4}})),
    'classification': ({'data': dict(SYNTHETIC), 'model': dict(TINY_MODEL, num_classes=2)},
                       ('model.num_classes', {'model': {'num_classes': 1}})),
    'retrieval': ({'data': dict(BATCH, corpus='lra_retrieval', seq_len=32, max_examples=16,
                                lra_retrieval={'min_bytes': 64, 'max_bytes': 96}),
                   'model': dict(TINY_MODEL, num_classes=2, pooling='mean')},
                  ('model.pooling',
                   {'data': {'cls_token': False}, 'model': {'pooling': 'cls'}})),
    'qa': ({'data': dict(SYNTHETIC, question_len=3, max_answer_len=8), 'model': dict(TINY_MODEL)},
           ('data.question_len', {'data': {'question_len': 30}})),
    'seq2seq': ({'data': dict(SYNTHETIC, target_len=12),
                 'model': dict(TINY_MODEL, decoder_layers=1)},
                ('model.decoder_layers', {'model': {'decoder_layers': 0}})),
    'image': (dict(copy.deepcopy(image_digits.get_config('1d')),
                   data=dict(BATCH, corpus='digits', max_examples=16)),
              ('model.causal', {'model': {'causal': False}})),
    'sentence_mask': (dict(copy.deepcopy(hibert_config.get_config()),
                           data=dict(BATCH, corpus=CORPUS)),
                      ('model.hibert.summary_sentences',
                       {'model': {'hibert': {'summary_sentences': 2}}})),
    'masked_pretraining': ({'data': dict(SYNTHETIC), 'model': dict(TINY_MODEL)},
                           ('data.masking.replace_random',
                            {'data': {'masking': {'replace_mask': 0.9, 'replace_random': 0.2}}})),
    'extractive': (dict(copy.deepcopy(hibert_extractive.get_config()),
                        data=dict(BATCH, corpus=CORPUS)),
                   ('model.hibert.mask_rate', {'model': {'hibert': {'mask_rate': 0.5}}})),
}


def merged(values: dict, edit: dict) -> dict:
  """`values` with `edit` merged in, section by section (nested dicts merge)."""
  out = copy.deepcopy(values)
  for key, value in edit.items():
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      out[key] = merged(out[key], value)
    else:
      out[key] = copy.deepcopy(value)
  return out


def tiny_values(name: str, corpus: str) -> dict:
  """The tiny config of task `name` (sparse values), on the module's corpus."""
  assert name in TINY, f'task {name!r} is registered but has no tiny config in TINY here'
  values, _ = TINY[name]
  values = copy.deepcopy(values)
  values['task'] = name
  values.setdefault('train', {}).update(num_steps=2, log_every=1, eval_every=0,
                                        checkpoint_every=2, async_checkpointing=False)
  if values['data'].get('corpus') == CORPUS:
    values['data']['corpus'] = corpus
  model = values.setdefault('model', {})
  if 'hibert' in model:
    model.update(HIBERT_MODEL)
    model['hibert'].update(TINY_HIBERT)
  else:
    model.update(TINY_MODEL)
  return values


@pytest.fixture(scope='module', params=sorted(TASKS))
def stepped(request, corpus):
  """`(task, values, training task, device metrics, host metrics)` after one train step."""
  task = task_for(request.param)
  values = tiny_values(task.name, corpus)
  config = ml_collections.ConfigDict(resolve_config(values))
  training = task.training_task(config)
  state = training.enter_segment(training.fresh_state(), 0)
  state, device_metrics, units = training.train_step(state)
  assert units > 0 and int(state.step) == 1
  return task, values, training, jax.device_get(device_metrics), training.host_metrics(
      device_metrics)


def test_the_registry_is_keyed_by_each_task_name():
  assert set(TASKS) == set(TINY)
  for name, task in TASKS.items():
    assert task.name == name and task_for(name) is task


def test_an_unknown_task_names_the_key_and_the_closest_task():
  with pytest.raises(ConfigError, match='did you mean classification') as error:
    resolve_config({'task': 'clasification'})
  assert error.value.key == 'task'


def test_the_config_checks_reject_the_tasks_bad_value(stepped):
  task, values, *_ = stepped
  key, edit = TINY[task.name][1]
  with pytest.raises(ConfigError) as error:
    resolve_config(merged(values, edit))
  assert error.value.key == key


def test_one_train_step_gives_finite_sums(stepped):
  task, _, training, sums, _ = stepped
  assert training.unit == task.unit
  leaves = jax.tree_util.tree_leaves(sums)
  assert leaves and all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves), sums


def test_metrics_hold_the_report_columns(stepped):
  task, _, _, _, metrics = stepped
  wanted = {'loss'} | {key for key, _ in task.columns if key not in task.extra_metrics}
  assert wanted <= set(metrics), (task.name, sorted(wanted - set(metrics)))
  assert all(math.isfinite(metrics[key]) for key in wanted)
  assert set(task.extra_metrics) <= {key for key, _ in task.columns}


# ---- no switch on a task's name outside tasks/ ----------------------------------------------

SWITCH = re.compile(r"\btask\s*(==|!=|\bin\b|\bnot\s+in\b)|\btask\]\s*(==|!=|\bin\b)|"
                    r"(==|!=)\s*['\"](" + '|'.join(TINY) + r")['\"]")


def switches(path: pathlib.Path) -> list:
  return [f'{path.relative_to(ROOT)}:{number}: {line.strip()}'
          for number, line in enumerate(path.read_text().splitlines(), 1)
          if SWITCH.search(line.split('#')[0])]


def test_the_switch_pattern_finds_switches():
  for line in ("if config.task == 'lm':", "  if task not in TASKS:", "x = task in HIBERT",
               "if config['task'] != 'qa'", "kind = 'decoder' if name == 'image' else 'x'"):
    assert SWITCH.search(line), line
  assert not SWITCH.search('task = task_for(config.task)')


def test_no_code_outside_tasks_switches_on_a_task_name():
  files = [p for p in (ROOT / 'longformer_jax').rglob('*.py')
           if 'tasks' not in p.relative_to(ROOT / 'longformer_jax').parts[:1]]
  files += [ROOT / name for name in ('train.py', 'eval.py', 'generate.py', 'memory_check.py')]
  found = [hit for path in files for hit in switches(path)]
  assert not found, 'switches on a task name (ask the task object, tasks/):\n' + '\n'.join(found)

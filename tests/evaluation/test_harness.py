"""The lm-evaluation-harness backend (longformer_jax/generation/harness/), through lm-eval's own
`simple_evaluate` on local tasks (tests/data/harness, tools/make_harness_fixtures.py):

- on the imported GPT-2 and Llama fixtures (contexts of 300 and 320 tokens), every request
  of a 50-item multiple-choice task, a rolling-perplexity task and a generation task gets
  transformers' answer (log-probabilities within 1e-4 relative, the same greedy flags,
  accuracies and generated text);
- rolling log-likelihoods read chunk by chunk through a memory (a Transformer-XL run of
  8-token chunks, texts of up to 140 chunks) are eval.py's: the word perplexity equals the
  one eval.py's bits per byte implies on the same texts and chunks;
- generate_until gives generate.py's greedy text on prompts longer than a chunk;
- the passkey task scores the documents eval.passkey_grid scores, with the same numbers;
- eval.py's `eval.harness_tasks` writes WORKDIR/harness/results.json;
- bad input is one line naming the setting (exit status 2 on the command line).
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

import eval as eval_script
import generate as generate_script
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.config.errors import ConfigError, UserError
from longformer_jax.convert.workdir_cli import convert_to_workdir
from longformer_jax.data import passkey
from longformer_jax.evaluation import passkey_grid
from longformer_jax.evaluation.eval_config import EvalConfig
from longformer_jax.evaluation.lm_evaluator import LN2, Evaluator
from longformer_jax.evaluation.passkey_scoring import PasskeyScorer
from longformer_jax.generation.harness import task_run
from longformer_jax.generation.harness.harness_lm import LongformerJaxLM
from longformer_jax.generation.harness.harness_settings import HarnessSettings
from longformer_jax.generation.sampling import SamplingSettings
from longformer_jax.generation.text_generation import generate_text
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.tasks.registry import task_for
from longformer_jax.train import initialization, run_directory
from tests.support.tiny_models import VOCAB, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS_DATA = os.path.join(REPO, 'tests', 'data', 'harness')
HF_DATA = os.path.join(REPO, 'tests', 'data', 'hf')
LOCAL_TASKS = ('harness_choice', 'harness_rolling', 'harness_generate')
RELATIVE = 1e-4


def write_random_run(workdir: str, **model) -> ml_collections.ConfigDict:
  """A run directory holding a randomly initialised tiny byte-level model (tiny_config:
  chunks of 8) as a parameters-only checkpoint of step 0, as an import writes one."""
  config = tiny_config(**model)
  model_config = lm_model_config(config.model, VOCAB)
  params = initialization.init_params(DecoderLM(model_config), jax.random.PRNGKey(3), 1,
                                      config.data.chunk_len)
  params = jax.tree_util.tree_map(np.asarray, nn.meta.unbox(params))
  with Checkpointer(workdir, config.train.keep_checkpoints, async_save=False) as checkpointer:
    checkpointer.save_params(0, params, {'step': 0})
  run_directory.write_config(config, workdir)
  return config


def settings_for(workdir: str, tasks=LOCAL_TASKS, **options) -> HarnessSettings:
  return HarnessSettings(workdir=workdir, tasks=tuple(tasks), include_path=HARNESS_DATA,
                         **options).validate()


def samples_of(results: dict, task: str) -> list:
  return sorted(results['samples'][task], key=lambda sample: sample['doc_id'])


def local_rows(name: str) -> list:
  with open(os.path.join(HARNESS_DATA, name)) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def imported_lms(tmp_path_factory):
  """Name -> the backend over the fixture's import (built on first use, kept)."""
  built = {}

  def lm_of(name: str) -> LongformerJaxLM:
    if name not in built:
      workdir = str(tmp_path_factory.mktemp(name) / 'run')
      convert_to_workdir(os.path.join(HF_DATA, name), workdir)
      built[name] = LongformerJaxLM(batch_size=16, settings=settings_for(workdir))
    return built[name]
  return lm_of


@pytest.fixture(scope='module')
def xl_run(tmp_path_factory):
  """A random Transformer-XL run (1 layer, chunks of 8, memory of 16) and its backend."""
  workdir = str(tmp_path_factory.mktemp('xl') / 'run')
  write_random_run(workdir, attention='xl', num_layers=1)
  return workdir, LongformerJaxLM(batch_size=8, settings=settings_for(workdir))


@pytest.mark.parametrize('name', ['gpt2_long', 'llama_long'])
def test_local_tasks_give_transformers_answers(imported_lms, name):
  lm = imported_lms(name)
  results = task_run.evaluate_tasks(lm, lm.settings, log_samples=True)
  with open(os.path.join(HARNESS_DATA, f'reference_{name}.json')) as f:
    reference = json.load(f)
  worst = 0.0
  choice = samples_of(results, 'harness_choice')
  assert len(choice) == 50
  for sample, expected in zip(choice, reference['harness_choice']['responses']):
    answers = [response[0] for response in sample['resps']]
    for (log_prob, greedy), (want, want_greedy) in zip(answers, expected, strict=True):
      worst = max(worst, abs(log_prob - want) / abs(want))
      assert greedy == want_greedy, (sample['doc_id'], answers, expected)
  rolling = samples_of(results, 'harness_rolling')
  for sample, want in zip(rolling, reference['harness_rolling']['responses'], strict=True):
    worst = max(worst, abs(sample['resps'][0][0] - want) / abs(want))
  assert worst < RELATIVE
  for metric in ('acc,none', 'acc_norm,none'):
    assert results['results']['harness_choice'][metric] == \
        reference['harness_choice']['metrics'][metric]
  assert 0 < results['results']['harness_choice']['acc,none'] < 1
  for metric, want in reference['harness_rolling']['metrics'].items():
    assert results['results']['harness_rolling'][metric] == pytest.approx(want, rel=RELATIVE)
  generated = [sample['resps'][0][0] for sample in samples_of(results, 'harness_generate')]
  assert generated == reference['harness_generate']['responses']
  info = results['config']
  assert info['backend'] == 'longformer_jax' and info['carries_memory'] is False
  assert info['chunk_len'] == info['imported_context'] == (300 if name == 'gpt2_long' else 320)


def eval_py_nats(lm: LongformerJaxLM, texts: list) -> tuple[float, float]:
  """(nats eval.py's bits per byte stand for on `texts`, each text in a row of its own and so
  read in the harness's chunks; the nats of the BOS that ends each document in eval.py's
  streams, which eval.py scores and the rolling log-likelihood does not)."""
  run = lm.scoring_run
  tokenizer = run.run.tokenizer
  documents = [np.asarray(tokenizer.encode(text), np.int32) for text in texts]
  mesh = make_mesh(run.run.config.parallel.mesh_shape)
  evaluator = Evaluator(run.model_config, tokenizer, batch_size=len(texts),
                        chunk_len=run.chunk_len, mesh=mesh,
                        rules=run.run.config.parallel.logical_axis_rules,
                        param_shardings=sharding.replicated(mesh))
  metrics = evaluator.evaluate(run.run.params, documents)
  ends = lm.scorer.score([[tokenizer.bos_id, *d, tokenizer.bos_id] for d in documents],
                         [1] * len(documents))
  return metrics['bits_per_byte'] * LN2 * metrics['bytes'], -sum(lp for lp, _ in ends)


@pytest.mark.parametrize('which', ['xl', 'gpt2_long'])
def test_rolling_word_perplexity_is_eval_py_bits_per_byte(which, xl_run, imported_lms):
  lm = xl_run[1] if which == 'xl' else imported_lms(which)
  texts = [row['text'] for row in local_rows('rolling.jsonl')]
  results = task_run.evaluate_tasks(lm, dataclasses.replace(lm.settings,
                                                            tasks=('harness_rolling',)))
  eval_nats, end_nats = eval_py_nats(lm, texts)
  words = sum(len(text.split()) for text in texts)
  implied = math.exp((eval_nats - end_nats) / words)
  assert results['results']['harness_rolling']['word_perplexity,none'] == \
      pytest.approx(implied, rel=1e-5)
  if which == 'xl':       # up to 140 chunks of 8, the memory carried
    assert lm.scoring_run.carries_memory and max(len(t) for t in texts) > 100 * 8


def test_generate_until_is_generate_py_greedy_text(xl_run):
  workdir, lm = xl_run
  prompts = [row['prompt'] for row in local_rows('generate.jsonl')]
  results = task_run.evaluate_tasks(lm, dataclasses.replace(lm.settings,
                                                            tasks=('harness_generate',)),
                                    log_samples=True)
  generated = [sample['resps'][0][0] for sample in samples_of(results, 'harness_generate')]
  decoder, tokenizer, _ = generate_script.load_decoder(workdir)
  expected = [generate_text(decoder, tokenizer, prompt, max_new_tokens=8, stops=['w50'],
                            settings=SamplingSettings(temperature=0.0)).text
              for prompt in prompts]
  assert generated == expected
  assert len(''.join(generated)) > 0 and max(len(p) for p in prompts) > 4 * 8


def test_passkey_task_scores_the_passkey_grid_documents(tmp_path):
  workdir = str(tmp_path / 'knn')
  config = write_random_run(
      workdir, attention='vanilla', mem_len=16, layer_schedule={'attention': 'vanilla,memorizing'},
      memorizing={'memory_size': 128, 'top_k': 4})
  settings = HarnessSettings(workdir=workdir, tasks=('passkey',), metadata=json.dumps(
      {'passkey_lengths': [120, 150], 'passkey_depths': [0, 100], 'passkey_documents': 1}))
  lm = LongformerJaxLM(settings=settings)
  results = task_run.evaluate_tasks(lm, settings, log_samples=True)
  samples = samples_of(results, 'passkey')
  assert 'memorizing (memory 128) in layer 1' in results['config']['memory']
  # lm-eval scores ' 12345' (it moves the context's trailing space to the continuation); the
  # grid scores the digits: the same documents, split after the space.
  requests = [sample['arguments'][0] for sample in samples]
  assert all(context.endswith('The pass key is ') and key.isdigit() and len(key) == 5
             for context, key in requests)
  answers = lm._loglikelihood_tokens([
      ((context, key), lm.tok_encode(context), lm.tok_encode(key, False))
      for context, key in requests])
  task_answers = [sample['resps'][0][0] for sample in samples]
  assert all(task < digits for (task, _), (digits, _) in zip(task_answers, answers))
  grid = passkey_grid.parse_grid('lengths=120,150;depths=0,100;documents=1;memories=trained',
                                 default_chunk=8)
  documents = [d for _, _, d in passkey_grid.grid_documents(grid, passkey.byte_encode)]
  mesh = make_mesh(config.parallel.mesh_shape)
  scorer = PasskeyScorer(lm.scoring_run.model_config, batch_size=8, chunk_len=8, mesh=mesh,
                         rules=config.parallel.logical_axis_rules,
                         param_shardings=sharding.replicated(mesh))
  scores = scorer.score(lm.scoring_run.run.params, documents, 257, 256)
  np.testing.assert_allclose([log_prob for log_prob, _ in answers], -scores['nll'], rtol=1e-5)
  assert [greedy for _, greedy in answers] == [int(c) == 5 for c in scores['correct']]
  assert results['results']['passkey']['acc,none'] == np.mean([g for _, g in task_answers])


def test_eval_py_runs_the_configured_harness_tasks(xl_run, capsys):
  workdir, _ = xl_run
  config = ml_collections.ConfigDict(tiny_config(attention='xl', num_layers=1).to_dict())
  config.eval.harness_tasks = 'harness_choice'
  config.eval.harness_include_path = HARNESS_DATA
  config.eval.harness_limit = 5
  results = eval_script.evaluate_run(config, workdir)
  with open(os.path.join(workdir, 'harness', 'results.json')) as f:
    written = json.load(f)
  assert written['results'] == json.loads(json.dumps(results['results']))
  assert written['results']['harness_choice']['sample_len'] == 5
  assert 'memory carried across chunks of 8 tokens' in written['config']['memory']
  assert '|harness_choice|' in capsys.readouterr().out.replace(' ', '')


def test_bad_input_names_the_setting(xl_run, imported_lms, tmp_path):
  workdir, _ = xl_run
  empty = tmp_path / 'no_checkpoint'
  empty.mkdir()
  (empty / 'config.json').write_text(open(os.path.join(workdir, 'config.json')).read())
  with pytest.raises(ConfigError, match=r'^--workdir: no checkpoint in .*; train first'):
    task_run.evaluate_workdir(settings_for(str(empty), tasks=['harness_choice']))
  with pytest.raises(ConfigError, match=r'^config.eval.harness_include_path: .* not a folder'):
    task_run.find_tasks(HarnessSettings.from_eval_config(
        ml_collections.ConfigDict(dict(harness_tasks='passkey', harness_include_path='/none',
                                       harness_limit=0, batch_size=0, step=-1, chunk_len=0)),
        workdir))
  # A model without memory read in chunks of 16: a 20-word text is refused, not cut.
  lm = imported_lms('gpt2_long')
  short = dataclasses.replace(lm.scoring_run, chunk_len=16)
  lm = LongformerJaxLM.from_scoring_run(short, lm.settings, batch_size=4)
  with pytest.raises(ConfigError, match=r'^--chunk_len: the rolling loglikelihood of .* reads '
                     r'\d+ tokens, more than one chunk of 16, and vanilla attention keeps no '
                     'memory across chunks'):
    task_run.evaluate_tasks(lm, dataclasses.replace(lm.settings, tasks=('harness_rolling',)))
  with pytest.raises(UserError, match='do_sample=True'):
    lm.generate_until([type('Request', (), {'args': ('w5', {'do_sample': True})})()])


def test_eval_settings_of_the_harness_are_checked():
  assert EvalConfig.build({'harness_tasks': 'passkey'}, 'eval').harness_tasks == 'passkey'
  with pytest.raises(ConfigError, match="^config.eval.harness_tasks: 'passkey' cannot be "
                     'combined with eval.mem_lens'):
    EvalConfig.build({'harness_tasks': 'passkey', 'mem_lens': '0,16'}, 'eval')
  with pytest.raises(ConfigError, match='^config.eval.harness_limit: .*read only with '
                     'eval.harness_tasks'):
    EvalConfig.build({'harness_limit': 5}, 'eval')
  config = ml_collections.ConfigDict({'task': 'classification', 'eval': dataclasses.asdict(
      EvalConfig.build({'harness_tasks': 'passkey'}, 'eval'))})
  with pytest.raises(ConfigError, match="^config.eval.harness_tasks: is read only by task "
                     "'lm' \\(this run's task is 'classification'\\)"):
    eval_script.check_eval_keys(config, task_for('classification'))


def test_command_line_bad_input_is_one_line_with_status_2(tmp_path):
  """A workdir without checkpoints (its config.json written, as a run that never saved)."""
  run_directory.write_config(tiny_config(attention='xl', num_layers=1), str(tmp_path))
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.generation.harness', f'--workdir={tmp_path}',
       '--tasks=passkey_256'], cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [
      f'error: --workdir: no checkpoint in {tmp_path}/checkpoints; train first (an import: '
      f'python -m longformer_jax.convert.hf --hf_dir=DIR --workdir={tmp_path})']
  assert result.stdout == ''


@pytest.mark.slow
def test_an_unknown_task_names_the_closest_one(tmp_path):
  settings = HarnessSettings(workdir=str(tmp_path), tasks=('passkey_4k', 'hellaswagg'))
  with pytest.raises(ConfigError, match=r"^--tasks: no lm-eval task, group or tag 'hellaswagg' "
                     r'in lm-eval 0\.4\.13 and .*lm_eval_tasks; did you mean hellaswag\?$'):
    task_run.find_tasks(settings)

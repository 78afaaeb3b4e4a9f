"""The passkey grid (evaluation/passkey_grid.py), its heat maps, and eval.py end to end.

Independent references:
- scoring: a plain loop over documents and answer positions that runs a
  memory-less model once over the context the eval-time memory implies
  (no memory: the answer's own chunk up to it; a FIFO memory of M: also the
  M tokens before that chunk) and reads the last position's logits in
  float64. Exact for `none` at any depth of model; for `xl` (cached hidden
  states) and `attendre_fifo` (cached keys and values) with one layer, where
  the cached entries are the embeddings of those tokens (deeper layers cache
  states computed with their own, older context, as in Transformer-XL);
- heat maps: read back with the independent PNG reader of test_image_sampling;
- cells: accuracies recomputed from per-document counts by hand.
"""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import passkey
from longformer_jax.evaluation import heatmap_png, passkey_grid
from longformer_jax.evaluation.eval_config import EvalConfig
from longformer_jax.evaluation.passkey_scoring import PasskeyScorer
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization
from longformer_jax.train.lm_objective import chunk_context
from tests.support.png_reader import read_png
from tests.support.repo_paths import REPO_ROOT
from tests.support.tiny_models import VOCAB, tiny_config

BOS, PAD = 257, 256
CHUNK = 32


def test_grid_spec_defaults_and_memories():
  grid = passkey_grid.parse_grid('max_length=1024;memories=none,xl,sinks:64,attendre_lfa,knn;'
                                 'memory_size=128;rope_max_distance=255', default_chunk=64)
  assert grid.lengths == (256, 512, 1024) and grid.depths == (0, 25, 50, 75, 100)
  assert grid.documents == 4 and grid.chunk == 64
  assert [m.label for m in grid.memories] == ['none', 'xl:128', 'sinks:64', 'attendre_lfa:128',
                                              'knn:128']
  points = {m.label: m.point for m in grid.memories}
  assert (points['none'].variant, points['none'].memory_size) == ('vanilla', 0)
  assert points['attendre_lfa:128'].policy == 'lfa'
  assert points['sinks:64'].variant == 'streaming_sinks'
  # The cap applies to the memories that read it; the others show '-'.
  assert dict(points['knn:128'].extra) == {'rope_max_distance': 255}
  assert dict(points['xl:128'].extra) == {'rope_max_distance': '-'}
  assert passkey_grid.png_name('attendre_lfa:128') == 'passkey_grid_attendre_lfa_128.png'


@pytest.mark.parametrize('spec, message', [
    ('memories=knm', "unknown memory 'knm'.*did you mean knn\?"),
    ('depths=0,150', 'depths are percent'),
    ('lengths=256;max_length=512', 'lengths or max_length'),
    ('lengths=a', 'lengths must be integers'),
    ('documents=0', 'documents and chunk must be > 0'),
    ('memories=xl:big', 'must be an integer'),
    ('memories=none;top_k=4', "no memory of the grid reads 'top_k'"),
    ('memories=none,none', 'given twice'),
    ('documents', "expected 'key=value"),
])
def test_bad_specs_name_the_key(spec, message):
  with pytest.raises(ConfigError, match=message) as error:
    passkey_grid.parse_grid(spec, default_chunk=64)
  assert error.value.key == 'eval.passkey_grid'
  with pytest.raises(ConfigError, match='config.eval.passkey_grid'):
    EvalConfig.build({'passkey_grid': spec}, 'eval')


def test_eval_config_refuses_grid_with_memory_sweep():
  assert EvalConfig.build({'passkey_grid': 'lengths=256'}, 'eval').passkey_grid == 'lengths=256'
  with pytest.raises(ConfigError,
                     match="config.eval.passkey_grid: 'lengths=256' cannot be combined"):
    EvalConfig.build({'passkey_grid': 'lengths=256', 'memory_sweep': 'memory_size=8'}, 'eval')


def test_heatmap_cells_read_back_in_their_colours(tmp_path):
  values = np.array([[0.0, 0.5, 1.0], [0.25, np.nan, 0.75]])
  path = str(tmp_path / 'map.png')
  heatmap_png.write_heatmap(path, values, cell=5, gap=1, bar=3)
  header, pixels = read_png(open(path, 'rb').read())
  assert (header['height'], header['width']) == (1 + 2 * 6 + 4, 1 + 3 * 6)
  expected = {0.0: (215, 48, 39), 0.5: (254, 224, 139), 1.0: (26, 152, 80)}
  for r in range(2):
    for c in range(3):
      cell = pixels[1 + r * 6:6 + r * 6, 1 + c * 6:6 + c * 6]
      value = values[r, c]
      want = (128, 128, 128) if np.isnan(value) else expected.get(value)
      if want is None:       # between two anchors: linear in each channel
        low, high = (0.0, 0.5) if value < 0.5 else (0.5, 1.0)
        t = (value - low) / (high - low)
        want = np.round(np.array(expected[low]) * (1 - t) + np.array(expected[high]) * t)
      assert (cell == np.asarray(want, np.uint8)).all(), (r, c)
  assert (pixels[0] == 0).all() and (pixels[:, 0] == 0).all()          # the gaps
  bar = pixels[-3:, 1:-1]
  assert tuple(bar[0, 0]) == expected[0.0] and tuple(bar[0, -1]) == expected[1.0]


def test_cells_count_a_document_only_when_every_answer_token_is_right(tmp_path):
  grid = passkey_grid.parse_grid('lengths=128,160;depths=0,100;documents=2;memories=none',
                                 default_chunk=CHUNK)
  documents = passkey_grid.grid_documents(grid, passkey.byte_encode)
  # correct answer tokens per document, in the order (length, depth, index).
  correct = np.array([5, 5, 4, 5, 0, 0, 5, 3])
  nll = np.arange(8, dtype=np.float64)
  cells = passkey_grid.cell_rows(grid.memories[0], documents, dict(correct=correct, nll=nll))
  by_cell = {(c['length'], c['depth']): c for c in cells}
  assert by_cell[128, 0]['accuracy'] == 1.0 and by_cell[128, 100]['accuracy'] == 0.5
  assert by_cell[160, 0]['accuracy'] == 0.0 and by_cell[160, 100]['accuracy'] == 0.5
  assert by_cell[160, 100]['digit_accuracy'] == 0.8 and by_cell[128, 100]['digit_loss'] == 0.5
  assert all(c['n'] == 2 for c in cells)
  result = passkey_grid.write_grid(grid, cells, str(tmp_path), dict(checkpoint_step=7))
  saved = json.load(open(tmp_path / 'passkey_grid.json'))
  assert saved == json.loads(json.dumps(result)) and saved['checkpoint_step'] == 7
  assert saved['axes']['depths'] == [0, 100] and saved['axes']['lengths'] == [128, 160]
  assert saved['memories'][0]['heatmap'] == 'passkey_grid_none.png'
  _, pixels = read_png(open(tmp_path / 'passkey_grid_none.png', 'rb').read())
  # Row depth 100 (bottom), column 160 (right): accuracy 0.5, yellow.
  assert tuple(pixels[1 + 17 + 8, 1 + 17 + 8]) == (254, 224, 139)


@pytest.fixture(scope='module')
def tiny_models():
  """Random 1- and 2-layer vanilla models without memory, and the mesh."""
  models = {}
  for layers in (1, 2):
    config = tiny_config(attention='vanilla', mem_len=0, num_layers=layers)
    model_config = lm_model_config(config.model, VOCAB)
    init = jax.jit(lambda rng, model=DecoderLM(model_config):
                   nn.unbox(initialization.init_params(model, rng, 1, CHUNK)))
    params = init(jax.random.PRNGKey(layers))
    models[layers] = (config.model, model_config, params)
  config = tiny_config()
  return models, make_mesh(config.parallel.mesh_shape), config.parallel.logical_axis_rules


def reference_scores(model_config, params, documents, memory_len: int) -> tuple:
  """Per document, (correct answer tokens, their nll): each answer token read off a one-shot
  causal pass over its implied context alone, one row per answer token (padded at the end)."""
  windows, owners = [], []
  for i, document in enumerate(documents):
    inputs = np.concatenate([[BOS], document.tokens[:-1]]).astype(np.int32)
    for p in range(document.answer_start, document.answer_start + document.answer_len):
      start = max(0, p // CHUNK * CHUNK - memory_len)
      windows.append((start, inputs[start:p + 1]))
      owners.append((i, document.tokens[p]))
  width = max(w.size for _, w in windows)
  tokens = np.full([len(windows), width], PAD, np.int32)
  positions = np.zeros([len(windows), width], np.int32)
  for row, (start, window) in enumerate(windows):
    tokens[row, :window.size] = window
    positions[row] = start + np.arange(width)
  chunk = dict(positions=positions, segment_ids=np.zeros_like(tokens),
               doc_start=np.arange(width)[None].repeat(len(windows), 0) == 0,
               input_mask=tokens != PAD)
  logits, _, _ = jax.jit(DecoderLM(model_config).apply)(
      {'params': params}, tokens, DecoderLM.init_state(model_config, len(windows)),
      chunk_context(chunk, deterministic=True))
  correct, nll = np.zeros(len(documents), int), np.zeros(len(documents))
  for row, ((start, window), (i, target)) in enumerate(zip(windows, owners)):
    last = np.asarray(logits[row, window.size - 1], np.float64)
    log_probs = last - last.max() - np.log(np.sum(np.exp(last - last.max())))
    correct[i] += int(np.argmax(last) == target)
    nll[i] -= log_probs[target]
  return correct, nll


@pytest.mark.parametrize('layers, label, memory_len', [
    (2, 'none', 0), (1, 'xl:40', 40), (1, 'attendre_fifo:40', 40)])
def test_chunked_scores_equal_a_plain_loop_over_the_implied_context(tiny_models, layers, label,
                                                                    memory_len):
  models, mesh, rules = tiny_models
  trained, plain_config, params = models[layers]
  grid = passkey_grid.parse_grid(f'lengths=120,150;depths=0,60,100;documents=1;memories={label}',
                                 default_chunk=CHUNK)
  documents = [d for _, _, d in passkey_grid.grid_documents(grid, passkey.byte_encode)]
  model_config = passkey_grid.memory_model_config(trained, VOCAB, grid.memories[0])
  scorer = PasskeyScorer(model_config, batch_size=8, chunk_len=CHUNK, mesh=mesh,
                                      rules=rules, param_shardings=sharding.replicated(mesh))
  scores = scorer.score(params, documents, BOS, PAD)
  correct, nll = reference_scores(plain_config, params, documents, memory_len)
  np.testing.assert_array_equal(scores['correct'], correct)
  np.testing.assert_allclose(scores['nll'], nll, rtol=2e-5)
  assert nll.min() > 0


def test_reading_comprehension_cells_score_as_the_plain_loop(tiny_models):
  """`kind=attendre_qa`: the question-first documents in the grid's form (the answer passage
  the needle, the value and its '.' the answer) score as the plain loop scores them."""
  models, mesh, rules = tiny_models
  trained, plain_config, params = models[1]
  grid = passkey_grid.parse_grid('kind=attendre_qa;lengths=256;depths=0,100;documents=1;'
                                 'memories=xl:40', default_chunk=CHUNK)
  cells = passkey_grid.grid_documents(grid, passkey.byte_encode)
  assert [(length, depth) for length, depth, _ in cells] == [(256, 0), (256, 100)]
  documents = [d for _, _, d in cells]
  for document in documents:
    text = bytes(document.tokens.astype(np.uint8)).decode('ascii')
    assert text.startswith('Question: what is the ')
    answer = document.tokens[document.answer_start:document.answer_start + document.answer_len]
    assert bytes(answer.astype(np.uint8)).decode() == document.key + '.'
    needle = document.tokens[document.needle_start:document.needle_start + document.needle_len]
    assert f' is {document.key}.' in bytes(needle.astype(np.uint8)).decode()
  assert documents[0].needle_start < documents[1].needle_start
  scorer = PasskeyScorer(passkey_grid.memory_model_config(trained, VOCAB, grid.memories[0]),
                         batch_size=8, chunk_len=CHUNK, mesh=mesh, rules=rules,
                         param_shardings=sharding.replicated(mesh))
  scores = scorer.score(params, documents, BOS, PAD)
  correct, nll = reference_scores(plain_config, params, documents, 40)
  np.testing.assert_array_equal(scores['correct'], correct)
  np.testing.assert_allclose(scores['nll'], nll, rtol=2e-5)


@pytest.mark.parametrize('spec, message', [
    ('kind=trivia', "kind 'trivia': choose from passkey, attendre_qa"),
    ('kind=attendre_qa;lengths=128', 'lengths are context bytes, at least 256, got 128')])
def test_a_bad_reading_comprehension_grid_names_the_setting(spec, message):
  with pytest.raises(ConfigError, match='eval.passkey_grid') as error:
    passkey_grid.parse_grid(spec, default_chunk=CHUNK)
  assert message in str(error.value)


@pytest.fixture(scope='module')
def trained_passkey(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('passkey'))
  config = tiny_config(attention='vanilla', mem_len=0)
  config.data.update(corpus='passkey', chunk_len=128, chunks_per_step=1)
  config.train.update(num_steps=2, checkpoint_every=2)
  train_script.train(config, workdir)
  return workdir, config


def test_eval_writes_the_grid_and_a_heat_map_per_memory(trained_passkey):
  workdir, config = trained_passkey
  config.eval.update(passkey_grid='lengths=128,200;depths=0,100;documents=3;'
                                  'memories=none,sinks:32;chunk=64')
  result = eval_script.evaluate_run(config, workdir)
  out_dir = os.path.join(workdir, 'eval')
  saved = json.load(open(os.path.join(out_dir, 'passkey_grid.json')))
  assert saved['checkpoint_step'] == 2 and saved == json.loads(json.dumps(result))
  assert len(saved['cells']) == 2 * 2 * 2
  for cell in saved['cells']:
    assert {'memory', 'length', 'depth', 'accuracy', 'n'} <= set(cell) and cell['n'] == 3
    assert 0 <= cell['accuracy'] <= 1 and np.isfinite(cell['digit_loss'])
  for name in ('passkey_grid_none.png', 'passkey_grid_sinks_32.png'):
    header, _ = read_png(open(os.path.join(out_dir, name), 'rb').read())
    assert (header['width'], header['height']) == (1 + 2 * 17, 1 + 2 * 17 + 7)


@pytest.mark.slow
def test_command_lines_train_then_evaluate_the_grid(tmp_path):
  """train.py and eval.py as a user runs them: configs/passkey.py shrunk, a bad grid flag
  refused in one line with exit status 2, then a small grid (eval.py reads the model from the
  run's config.json)."""
  workdir = str(tmp_path / 'run')
  small = ['--config=configs/passkey.py', f'--workdir={workdir}']
  train = small + ['--config.model.d_model=32', '--config.model.d_ff=64',
                   '--config.model.num_heads=2', '--config.model.head_dim=16',
                   '--config.data.chunk_len=128', '--config.data.batch_size=8',
                   '--config.train.num_steps=2', '--config.train.eval_every=0',
                   '--config.train.checkpoint_every=2']
  root = REPO_ROOT

  def run(script, flags):
    return subprocess.run([sys.executable, script] + flags, cwd=root, capture_output=True,
                          text=True, timeout=600)
  assert run('train.py', train).returncode == 0
  bad = run('eval.py', [f'--workdir={workdir}',
                        '--config.eval.passkey_grid=memories=xl;depths=200'])
  assert bad.returncode == 2 and 'config.eval.passkey_grid: depths are percent' in bad.stderr
  assert 'Traceback' not in bad.stderr
  good = run('eval.py', [f'--workdir={workdir}', '--config.eval.passkey_grid=lengths=128,256;'
                         'depths=50;documents=2;memories=none,attendre_lfa:64'])
  assert good.returncode == 0, good.stderr[-2000:]
  saved = json.load(open(os.path.join(workdir, 'eval', 'passkey_grid.json')))
  assert [m['memory'] for m in saved['memories']] == ['none', 'attendre_lfa:64']
  assert len(saved['cells']) == 4 and '| attendre_lfa:64 |' in good.stdout

"""Scoring the answer causally behind delayed queries (evaluation/delayed_answer_scoring.py).

Independent reference: for each answer position p = a + k, a fresh run of the
model from the BOS, one document alone, over inputs [0, p] (the prompt [0, a)
in chunks of 8, then its remainder in steps of 4, 2, 1 as the bits give it,
then inputs a .. p one at a time), then D padding tokens built by hand; the
log-probabilities of the last padding slot, in float64. The scorer reads a
batch of documents with different answer starts in lockstep and must agree.
"""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import passkey
from longformer_jax.evaluation import passkey_grid
from longformer_jax.evaluation.delayed_answer_scoring import (DelayedAnswerScorer,
                                                               lockstep_rounds, prompt_steps)
from longformer_jax.evaluation.passkey_scoring import PasskeyScorer, document_batch
from longformer_jax.models.attendre_delay import total_delay
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization
from longformer_jax.train.lm_objective import lm_sums
from tests.support.tiny_models import VOCAB, tiny_config

BOS, PAD = 257, 256
CHUNK = 8


def document(length: int, answer_start: int, answer_len: int, seed: int):
  tokens = np.random.default_rng(seed).integers(0, 256, length).astype(np.int32)
  return types.SimpleNamespace(tokens=tokens, answer_start=answer_start, answer_len=answer_len,
                               needle_start=0, needle_len=1)


# Answer starts 19 (not on a chunk boundary), 40 (on one: the prompt is 5 whole chunks) and
# 13; the first two documents span several chunks of 8.
DOCUMENTS = [document(24, 19, 5, 1), document(44, 40, 4, 2), document(16, 13, 3, 3)]


@pytest.fixture(scope='module')
def setup():
  trained = tiny_config(attention='vanilla', mem_len=0, num_layers=2).model
  plain = lm_model_config(trained, VOCAB)
  init = jax.jit(lambda rng: nn.unbox(initialization.init_params(DecoderLM(plain), rng, 1,
                                                                 CHUNK)))
  config = tiny_config()
  return trained, init(jax.random.PRNGKey(5)), make_mesh(config.parallel.mesh_shape), \
      config.parallel.logical_axis_rules


def grid_model(trained, spec: str):
  grid = passkey_grid.parse_grid(f'lengths=256;{spec}', default_chunk=CHUNK)
  return passkey_grid.memory_model_config(trained, VOCAB, grid.memories[0])


def scorer(model_config, setup, **options):
  _, _, mesh, rules = setup
  return DelayedAnswerScorer(model_config, batch_size=8, chunk_len=CHUNK, mesh=mesh,
                             rules=rules, param_shardings=sharding.replicated(mesh), **options)


def context(positions, valid, reset):
  positions = np.asarray(positions, np.int32)[None]
  return AttentionContext(positions=positions, segment_ids=np.zeros_like(positions),
                          reset=np.asarray([reset]), valid=np.asarray(valid, bool)[None])


def reference_log_probs(model_config, params, doc) -> np.ndarray:
  """`[answer_len, vocab]` float64: a fresh run per answer position (module docstring)."""
  apply = jax.jit(DecoderLM(model_config).apply)
  delay = total_delay(model_config)
  inputs = np.concatenate([[BOS], doc.tokens[:-1]]).astype(np.int32)
  a, out = doc.answer_start, []
  rest = a % CHUNK
  steps = [CHUNK] * (a // CHUNK) + [n for n in (4, 2, 1) if rest & n]
  for p in range(a, a + doc.answer_len):
    state, begin = DecoderLM.init_state(model_config, 1), 0
    for length in steps + [1] * (p - a + 1):
      span = np.arange(begin, begin + length)
      _, state, _ = apply({'params': params}, inputs[None, span], state,
                          context(span, np.ones(length), begin == 0))
      begin += length
    assert begin == p + 1
    pad = np.arange(p + 1, p + 1 + delay)
    logits, _, _ = apply({'params': params}, np.full([1, delay], PAD, np.int32), state,
                         context(pad, np.zeros(delay), False))
    last = np.asarray(logits[0, -1], np.float64)
    out.append(last - last.max() - np.log(np.exp(last - last.max()).sum()))
  return np.stack(out)


def test_prompt_steps_are_whole_chunks_then_powers_of_two():
  assert prompt_steps(21, 8) == [8, 8, 4, 1] and prompt_steps(16, 8) == [8, 8]
  assert prompt_steps(100, 128) == [64, 32, 4] and prompt_steps(0, 8) == []


@pytest.mark.parametrize('chunk_len', [8, 12, 128])
def test_lockstep_rounds_give_each_row_its_own_prompt_steps(chunk_len):
  """Every row takes, in order, exactly the steps `prompt_steps` gives it alone; each round
  has one length and at least one row."""
  prompts = [0, 1, 7, 8, 21, 100, 257, 300]
  rounds = lockstep_rounds(prompts, chunk_len)
  for row, prompt in enumerate(prompts):
    assert [length for length, active in rounds if active[row]] == prompt_steps(prompt,
                                                                                chunk_len)
  assert all(active.any() for _, active in rounds)


@pytest.mark.parametrize('q_memory', [4, pytest.param(8, marks=pytest.mark.slow)])  # 8: -m slow
def test_each_answer_token_scores_as_a_fresh_run_flushed_after_it(setup, q_memory):
  trained, params, _, _ = setup
  model_config = grid_model(trained, f'memories=attendre_lra_max:16;q_memory={q_memory}')
  assert model_config.stack == 'attendre_delay' and not model_config.causal
  assert total_delay(model_config) == 2 * q_memory
  scores = scorer(model_config, setup, log_probs=True).score(params, DOCUMENTS, BOS, PAD)
  for i, doc in enumerate(DOCUMENTS):
    expected = reference_log_probs(model_config, params, doc)
    targets = doc.tokens[doc.answer_start:doc.answer_start + doc.answer_len]
    np.testing.assert_allclose(scores['token_log_probs'][i], expected, atol=1e-5)
    nll = -expected[np.arange(doc.answer_len), targets]
    np.testing.assert_allclose(scores['token_nll'][i], nll, atol=1e-5)
    np.testing.assert_array_equal(scores['token_correct'][i], expected.argmax(1) == targets)
    assert scores['correct'][i] == (expected.argmax(1) == targets).sum()
    np.testing.assert_allclose(scores['nll'][i], nll.sum(), atol=1e-4)
  assert (scores['entries'] > 0).all() and scores['state_bytes'] > 0


def test_an_answer_token_changes_no_prediction_before_its_input(setup):
  trained, params, _, _ = setup
  model_config = grid_model(trained, 'memories=attendre_lra_max:16;q_memory=4')
  score = scorer(model_config, setup, log_probs=True).score
  doc = DOCUMENTS[0]
  base = score(params, [doc], BOS, PAD)['token_log_probs'][0]
  a = doc.answer_start
  for k in range(doc.answer_len - 1):          # answer token k: the input at a + k + 1
    changed = types.SimpleNamespace(**vars(doc))
    changed.tokens = doc.tokens.copy()
    changed.tokens[a + k] = (doc.tokens[a + k] + 1) % 256
    log_probs = score(params, [changed], BOS, PAD)['token_log_probs'][0]
    np.testing.assert_array_equal(log_probs[:k + 1], base[:k + 1])
    assert np.abs(log_probs[k + 1] - base[k + 1]).max() > 1e-4


def test_without_delay_it_scores_as_teacher_forcing(setup):
  """q_memory 0 (a memory that holds the documents whole, so chunking cannot matter)."""
  trained, params, mesh, rules = setup
  model_config = grid_model(trained, 'memories=attendre_fifo:64')
  assert total_delay(model_config) == 0 and model_config.causal
  delayed = scorer(model_config, setup).score(params, DOCUMENTS, BOS, PAD)
  forced = PasskeyScorer(model_config, batch_size=8, chunk_len=CHUNK, mesh=mesh, rules=rules,
                         param_shardings=sharding.replicated(mesh)).score(
                             params, DOCUMENTS, BOS, PAD)
  np.testing.assert_array_equal(delayed['correct'], forced['correct'])
  np.testing.assert_allclose(delayed['nll'], forced['nll'], rtol=1e-5, atol=1e-5)


def test_grid_q_memory_sizes_and_labels():
  grid = passkey_grid.parse_grid('lengths=256;memories=attendre_lra_max:128,attendre_fifo:16,'
                                 'xl:64,none;q_memory=half', default_chunk=CHUNK)
  assert [m.label for m in grid.memories] == ['attendre_lra_max:128+q64', 'attendre_fifo:16+q8',
                                              'xl:64', 'none']
  assert [m.point.q_memory_size for m in grid.memories] == [64, 8, 0, 0]
  assert grid.memories[0].describe()['q_memory_size'] == 64
  assert passkey_grid.png_name(grid.memories[0].label) == \
      'passkey_grid_attendre_lra_max_128_q64.png'
  grid = passkey_grid.parse_grid('lengths=256;memories=attendre_lfa:32,sinks:32;q_memory=8',
                                 default_chunk=CHUNK)
  assert [m.label for m in grid.memories] == ['attendre_lfa:32+q8', 'sinks:32']
  assert [m.point.q_memory_size for m in grid.memories] == [8, 0]
  grid = passkey_grid.parse_grid('lengths=256;memories=attendre_lfa:32', default_chunk=CHUNK)
  assert grid.memories[0].label == 'attendre_lfa:32' and grid.memories[0].point.q_memory_size == 0


def test_q_causal_keeps_the_trained_causal_mask_for_a_q_memory_only(setup):
  """The control `q_causal=1`: the delayed stack under the trained causal mask, its own label
  and row field; without it a Q memory's model is bidirectional; a memory without a Q memory
  is unaffected."""
  trained = setup[0]
  spec = 'lengths=256;memories=attendre_lra_max:16,attendre_fifo:16;q_memory={q}'
  grid = passkey_grid.parse_grid(spec.format(q='half') + ';q_causal=1', default_chunk=CHUNK)
  assert [m.label for m in grid.memories] == ['attendre_lra_max:16+q8causal',
                                              'attendre_fifo:16+q8causal']
  assert grid.memories[0].describe()['q_causal'] is True
  config = passkey_grid.memory_model_config(trained, VOCAB, grid.memories[0])
  assert config.causal and config.stack == 'attendre_delay'
  plain = passkey_grid.parse_grid(spec.format(q='half'), default_chunk=CHUNK)
  assert 'q_causal' not in plain.memories[0].describe()
  assert not passkey_grid.memory_model_config(trained, VOCAB, plain.memories[0]).causal
  without = passkey_grid.parse_grid(spec.format(q=0) + ';q_causal=1', default_chunk=CHUNK)
  assert [m.label for m in without.memories] == ['attendre_lra_max:16', 'attendre_fifo:16']
  with pytest.raises(ConfigError, match='q_causal must be 0 or 1'):
    passkey_grid.parse_grid(spec.format(q='half') + ';q_causal=maybe', default_chunk=CHUNK)


@pytest.mark.parametrize('value', ['-1', 'abc', 'half,8'])
def test_a_bad_q_memory_is_one_line_naming_the_grid(value):
  with pytest.raises(ConfigError, match='q_memory') as error:
    passkey_grid.parse_grid(f'memories=attendre_fifo:16;q_memory={value}', default_chunk=CHUNK)
  assert error.value.key == 'eval.passkey_grid' and '\n' not in str(error.value)


def test_the_grid_scores_a_q_memory_with_the_delayed_scorer(setup):
  trained, params, mesh, rules = setup
  grid = passkey_grid.parse_grid('lengths=120;depths=50;documents=2;chunk=16;'
                                 'memories=attendre_lra_max:16;q_memory=half', CHUNK)
  tokenizer = types.SimpleNamespace(encode=passkey.byte_encode, vocab_size=VOCAB, bos_id=BOS,
                                    pad_id=PAD)
  cells, costs = passkey_grid.evaluate_grid(grid, trained, tokenizer, params, batch_size=8,
                                            mesh=mesh, rules=rules,
                                            param_shardings=sharding.replicated(mesh))
  documents = [d for _, _, d in passkey_grid.grid_documents(grid, passkey.byte_encode)]
  model_config = passkey_grid.memory_model_config(trained, VOCAB, grid.memories[0])
  scores = DelayedAnswerScorer(model_config, batch_size=8, chunk_len=16, mesh=mesh, rules=rules,
                               param_shardings=sharding.replicated(mesh)).score(
                                   params, documents, BOS, PAD)
  [cell] = cells
  assert cell['memory'] == 'attendre_lra_max:16+q8'
  np.testing.assert_allclose(cell['digit_loss'],
                             scores['nll'].sum() / sum(d.answer_len for d in documents),
                             rtol=1e-6)
  assert costs['attendre_lra_max:16+q8']['seconds_per_1k_tokens'] > 0


def test_a_look_ahead_model_scores_its_answers_as_its_training_loss_does(setup):
  """A model trained with `hide_predicted` (causal=False): with Q memories longer than the
  documents and a K/V memory that holds them, every query is answered once its document
  is read, so the scorer's answer nll equals the training loss (train/lm_objective.py)
  over the answer targets, which hides the answer's inputs from the prompt's queries."""
  config = tiny_config(attention='attendre', stack='attendre_delay', causal=False,
                       scan_layers=False, num_layers=2,
                       attendre={'memory_size': 64, 'q_memory_size': 48,
                                 'hide_predicted': True}).model
  model_config = lm_model_config(config, VOCAB)
  params = nn.unbox(jax.jit(lambda rng: initialization.init_params(
      DecoderLM(model_config), rng, 1, CHUNK))(jax.random.PRNGKey(2)))
  scores = scorer(model_config, setup).score(params, DOCUMENTS, BOS, PAD)
  arrays = document_batch(DOCUMENTS, len(DOCUMENTS), CHUNK, BOS, PAD)
  batch = {key: jnp.asarray(arrays[key]) for key in
           ('inputs', 'targets', 'positions', 'segment_ids', 'doc_start', 'input_mask')}
  for i in range(len(DOCUMENTS)):
    row = {key: value[i:i + 1] for key, value in batch.items()}
    row['target_mask'] = jnp.asarray(arrays['answer_mask'][i:i + 1])
    _, sums = lm_sums(DecoderLM(model_config), params,
                      DecoderLM.init_state(model_config, 1), row, CHUNK)
    assert float(sums['tokens']) == DOCUMENTS[i].answer_len
    np.testing.assert_allclose(scores['nll'][i], float(sums['loss_sum']), rtol=1e-4)


def test_grid_reads_a_look_ahead_model_with_its_q_memory_and_causally_without_one():
  """A model trained with look-ahead: its own memory and Q memories keep it (and the flags);
  `q_causal=1` and memories without a Q memory read causally (hide_predicted off); a
  bidirectional model with no delay is refused (chunked scoring would show it the answer)."""
  look_ahead = tiny_config(attention='attendre', stack='attendre_delay', causal=False,
                           scan_layers=False, attendre={'memory_size': 16, 'q_memory_size': 8,
                                                        'hide_predicted': True}).model
  configs = {}
  for spec in ('memories=trained', 'memories=attendre_lra_max:16;q_memory=4',
               'memories=attendre_lra_max:16;q_memory=4;q_causal=1',
               'memories=attendre_lra_max:16'):
    grid = passkey_grid.parse_grid(f'lengths=256;{spec}', default_chunk=CHUNK)
    config = passkey_grid.memory_model_config(look_ahead, VOCAB, grid.memories[0])
    configs[spec.split(';')[-1]] = (config.causal, config.attendre.hide_predicted,
                                       total_delay(config))
  assert configs == {'memories=trained': (False, True, 16), 'q_memory=4': (False, True, 8),
                     'q_causal=1': (True, False, 8), 'memories=attendre_lra_max:16': (True, False, 0)}
  bidirectional = tiny_config(attention='attendre', stack='attendre_delay', causal=False,
                              scan_layers=False, attendre={'memory_size': 16}).model
  grid = passkey_grid.parse_grid('lengths=256;memories=trained', default_chunk=CHUNK)
  with pytest.raises(ConfigError, match='no Q memory'):
    passkey_grid.memory_model_config(bidirectional, VOCAB, grid.memories[0])

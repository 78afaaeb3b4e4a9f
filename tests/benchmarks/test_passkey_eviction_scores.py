"""benchmarks/passkey_eviction_scores.py: the needle's place in an Attendre memory per chunk.

Independent references: one layer's accounting on a memory of six slots
written by hand (which entries survive, their scores, the attention each
query gives them), and, on a random 2-layer model reading passkey documents
through a FIFO Attendre memory as large as the chunk, the needle tokens
held after chunk t counted from positions alone: with M = C, the memory
holds exactly chunk t's positions, so it holds the needle's tokens that lie
in chunk t, whatever the model computes.
"""

import functools
import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from benchmarks import passkey_eviction_scores as eviction
from longformer_jax.data import passkey
from longformer_jax.evaluation import passkey_grid
from longformer_jax.evaluation.passkey_scoring import answer_step
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.train import initialization
from tests.support.tiny_models import VOCAB, tiny_config

BOS, PAD = 257, 256
CHUNK = 64


def test_accounting_of_one_layer_by_hand():
  """Slots hold positions 0-5, the needle is [2, 4); after the step the memory holds 2, 4, 5
  and a new 9: 0, 1 and 3 were evicted. Two heads, three queries (the last padding)."""
  scores = np.array([[0.1, 0.5, 0.9, 0.3, 0.7, 0.2]], np.float32)
  weights = np.zeros([1, 2, 3, 6], np.float32)
  weights[0, :, 0] = [0.1, 0.1, 0.4, 0.2, 0.1, 0.1]       # both heads alike for query 0
  weights[0, 0, 1] = [0.0, 0.0, 0.0, 0.0, 0.5, 0.5]       # query 1: head 0 off the needle,
  weights[0, 1, 1] = [0.0, 0.0, 0.5, 0.5, 0.0, 0.0]       # head 1 on it
  weights[0, :, 2] = 1.0                                  # padding: must not count
  scored = dict(weights=weights, scores=scores, positions=np.arange(6, dtype=np.int32)[None],
                valid=np.ones([1, 6], bool))
  # Slot 4 is free but still stores the evicted needle entry 3: not held.
  after = types.SimpleNamespace(positions=np.array([[2, 9, 4, 5, 3, 0]], np.int32),
                                valid=np.array([[True, True, True, True, False, False]]))
  is_key = np.zeros([1, 16], bool)
  is_key[0, 2] = True
  out = eviction.needle_accounting(scored, after, np.array([2]), np.array([4]),
                                   np.array([[True, True, False]]), is_key)
  assert out['held'][0] == 1 and out['key_held'][0] == 1 and out['scored'][0] == 2
  assert out['needle_score'][0] == pytest.approx(0.6)                  # (0.9 + 0.3) / 2
  assert out['median'][0] == pytest.approx(0.4)
  assert out['threshold'][0] == pytest.approx(0.5)                     # max of 0.1, 0.5, 0.3
  assert out['rank'][0] == pytest.approx(3 / 4)                        # 0.1, 0.5, 0.2 below 0.6
  # Mean over heads, summed over the needle's slots: query 0 gives 0.6, query 1 gives 0.5.
  assert out['needle_mass'][0] == pytest.approx(0.55)
  # Both queries give the memory 1.0 in all: per needle entry 0.275 against 1/6 per entry.
  assert out['mass_ratio'][0] == pytest.approx(0.275 * 6)


def test_undefined_fields_are_nan_not_zero():
  scored = dict(weights=np.zeros([1, 1, 2, 3], np.float32), scores=np.zeros([1, 3], np.float32),
                positions=np.array([[0, 1, 2]], np.int32), valid=np.array([[True, True, False]]))
  after = types.SimpleNamespace(positions=scored['positions'], valid=scored['valid'])
  out = eviction.needle_accounting(scored, after, np.array([7]), np.array([9]),
                                   np.array([[True, True]]), np.zeros([1, 16], bool))
  assert out['held'][0] == 0 and out['scored'][0] == 0
  for field in ('needle_score', 'threshold', 'rank', 'needle_mass', 'mass_ratio'):
    assert np.isnan(out[field][0]), field


@pytest.fixture(scope='module')
def fifo_trace():
  """A random 2-layer Attendre model, FIFO memory of 64 = the chunk, reading 2 documents of
  384 tokens (needle depth 30% and 60%) as the grid does."""
  config = tiny_config(attention='attendre', attendre=dict(memory_size=CHUNK, policy='fifo'))
  grid = passkey_grid.parse_grid(f'lengths=384;depths=30,60;documents=1;'
                                 f'memories=attendre_lra_max:{CHUNK}', default_chunk=CHUNK)
  trained = lm_model_config(config.model, VOCAB)
  params = nn.unbox(initialization.init_params(DecoderLM(trained), jax.random.PRNGKey(0), 1,
                                               CHUNK))
  documents = [d for _, _, d in passkey_grid.grid_documents(grid, passkey.byte_encode)]
  fifo = passkey_grid.parse_grid(f'memories=attendre_fifo:{CHUNK}', CHUNK).memories[0]
  model_config = passkey_grid.memory_model_config(config.model, VOCAB, fifo)
  step = jax.jit(functools.partial(answer_step, model=DecoderLM(model_config),
                                   with_intermediates=True))
  trace, correct = eviction.trace_documents(step, params, model_config, documents, CHUNK, BOS,
                                            PAD)
  return documents, trace, correct


def test_needle_held_is_what_a_fifo_of_one_chunk_holds(fifo_trace):
  documents, trace, correct = fifo_trace
  assert len(trace) == 384 // CHUNK and all(len(layers) == 2 for layers in trace)
  for row, document in enumerate(documents):
    first = document.needle_start + 1                               # input positions (BOS)
    needle = np.arange(first, first + document.needle_len)
    key = document.tokens[document.answer_start:document.answer_start + document.answer_len]
    inputs = np.concatenate([[BOS], document.tokens[:-1]])
    for index, layers in enumerate(trace):
      in_chunk = needle[(needle >= index * CHUNK) & (needle < (index + 1) * CHUNK)]
      want_key = np.isin(inputs[in_chunk], key).sum()
      for fields in layers:
        assert fields['held'][row] == in_chunk.size, (row, index)
        assert fields['key_held'][row] == want_key, (row, index)
        # Scored: what the previous chunk left, i.e. the needle's tokens there.
        before = needle[(needle >= (index - 1) * CHUNK) & (needle < index * CHUNK)]
        assert fields['scored'][row] == before.size
        if before.size:
          assert 0 < fields['needle_mass'][row] < 1
  assert correct.shape == (2,) and (correct <= 5).all()


def test_rows_count_chunks_from_the_needle_and_end_at_the_answer(fifo_trace):
  documents, trace, _ = fifo_trace
  rows = eviction.relative_rows(trace, documents, CHUNK, last=2)
  for row, document in enumerate(documents):
    mine = [r for r in rows if r['document'] == row and r['layer'] == 0]
    needle_chunk = (document.needle_start + 1) // CHUNK
    answer_chunk = (document.answer_start + 1) // CHUNK
    want = [k for k in range(3) if needle_chunk + k < answer_chunk] + ['answer']
    assert [r['chunk'] for r in mine] == want
    assert mine[0]['held'] > 0 and mine[-1]['held'] == 0
  table = eviction.mean_table(rows)
  assert [r['chunk'] for r in table if r['layer'] == 1][-1] == 'answer'
  assert '| 0 | answer |' in eviction.markdown(table)

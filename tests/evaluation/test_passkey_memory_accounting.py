"""The passkey grid's accounting (memory held, bytes, cost) and its `trained` memory.

Independent references: the entries a FIFO memory of M holds after a
document read in whole chunks is M per layer whatever the length (a count by
hand, not by the code's own bookkeeping); the kNN memory keeps min(length,
M); the state's bytes are its arrays' shapes multiplied out by hand.
"""

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import passkey_memory
from longformer_jax.command_line import experiment_config
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import passkey
from longformer_jax.evaluation import memory_accounting, passkey_grid, trained_memory
from longformer_jax.evaluation.passkey_scoring import PasskeyScorer
from longformer_jax.memory import fifo, key_value
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization
from tests.support.tiny_models import VOCAB, tiny_config

BOS, PAD = 257, 256
CHUNK = 64


def test_held_entries_and_bytes_count_every_container_per_row():
  """Two layers, a FIFO of 6 and a key-value memory of 5, batch 2; row 1 half full."""
  first = fifo.create(2, 6, (4,), np.float32)
  first = first.replace(valid=np.array([[True] * 6, [False] * 3 + [True] * 3]))
  second = key_value.create(2, 5, 2, 3, np.float32)
  second = second.replace(valid=np.array([[True, True, False, False, True], [False] * 5]))
  state = [first, {'knn': second}]
  np.testing.assert_array_equal(memory_accounting.held_entries(state, 2), [9, 3])
  by_hand = sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(state)) // 2
  assert memory_accounting.state_bytes(state, 2) == by_hand
  assert by_hand >= (6 * 4 * 4 + 5 * 2 * 3 * 4 * 2)    # values; keys and values


def test_peak_host_memory_sees_a_large_allocation():
  with memory_accounting.PeakHostMemory() as small:
    np.ones(1 << 20, np.uint8).sum()
  with memory_accounting.PeakHostMemory() as large:
    block = np.ones(400 << 20, np.uint8)
    block.sum()
  del block
  assert large.bytes >= 400 << 20
  if small.exact and large.exact:           # Linux: the peak was reset in between
    assert large.bytes - small.bytes >= 300 << 20


def test_trained_memory_names_the_setting_it_resizes():
  knn = experiment_config('configs/passkey_memory.py:knn', []).model
  assert trained_memory.memory_kind(knn) == 'memorizing'
  assert trained_memory.size_key(knn) == 'memorizing.memory_size'
  assert trained_memory.trained_size(knn) == 2048
  resized = lm_model_config(knn, VOCAB, **trained_memory.model_overrides(knn, 65536))
  assert resized.memorizing.memory_size == 65536
  assert resized.memorizing.top_k == knn.memorizing.top_k and resized.mem_len == knn.mem_len == 128
  assert trained_memory.model_overrides(knn, 0) == {}
  expected = {'xl': 'mem_len', 'attendre_lfa': 'attendre.memory_size',
              'sinks': 'streaming_sinks.window', 'expire_span': 'mem_len'}
  for name, key in expected.items():
    model = experiment_config(f'configs/passkey_memory.py:{name}', []).model
    assert trained_memory.size_key(model) == key, name


def test_every_trained_passkey_config_resolves():
  for name in passkey_memory.MEMORIES:
    config = experiment_config(f'configs/passkey_memory.py:{name}', [])
    longest = passkey_memory.MEMORY_DATA.get(name, {}).get('passkey_max_length', 2048)
    assert config.data.passkey_max_length == longest and config.data.chunk_len == 128
  with pytest.raises(ConfigError, match='--config'):
    passkey_memory.get_config('kNN')


def test_grid_parses_trained_memories():
  grid = passkey_grid.parse_grid('lengths=256;memories=trained,trained:4096,xl:64',
                                 default_chunk=64)
  trained, resized, xl = grid.memories
  assert (trained.label, trained.point, trained.trained_size) == ('trained', None, 0)
  assert (resized.label, resized.trained_size) == ('trained:4096', 4096)
  assert xl.point.memory_size == 64
  knn = experiment_config('configs/passkey_memory.py:knn', []).model
  assert resized.describe(knn)['memory_size'] == 4096
  assert trained.describe(knn) == dict(memory='trained', variant='trained',
                                       size_key='memorizing.memory_size', memory_size=2048)
  delayed = experiment_config('configs/passkey_memory.py:attendre_lra_max_score', [
      ('model.stack', 'attendre_delay'), ('model.attendre.q_memory_size', '64')]).model
  assert trained.describe(delayed) == dict(
      memory='trained', variant='trained', size_key='attendre.memory_size', memory_size=128,
      q_memory_size=64, q_causal=True)
  scheduled = experiment_config('configs/passkey_memory.py:attendre_lra_max_score', [
      ('model.stack', 'attendre_delay'), ('model.scan_layers', 'False'),
      ('model.layer_schedule.attendre.q_memory_size', '32,96')]).model
  assert trained.describe(scheduled)['q_memory_size'] == 96
  for bad in ('trained:0', 'trained:x'):
    with pytest.raises(ConfigError, match='eval.passkey_grid'):
      passkey_grid.parse_grid(f'memories={bad}', default_chunk=64)


@pytest.fixture(scope='module')
def one_layer_model():
  config = tiny_config(attention='vanilla', mem_len=0, num_layers=1)
  model_config = lm_model_config(config.model, VOCAB)
  init = jax.jit(lambda rng: nn.unbox(initialization.init_params(DecoderLM(model_config), rng,
                                                                 1, CHUNK)))
  mesh = make_mesh(config.parallel.mesh_shape)
  return config.model, init(jax.random.PRNGKey(0)), mesh, config.parallel.logical_axis_rules


def _score_grid(one_layer_model, spec: str):
  """`(grid, documents, scores)`: the grid of `spec` (one memory) scored on the random model."""
  trained, params, mesh, rules = one_layer_model
  grid = passkey_grid.parse_grid(spec, default_chunk=CHUNK)
  documents = passkey_grid.grid_documents(grid, passkey.byte_encode)
  model_config = passkey_grid.memory_model_config(trained, VOCAB, grid.memories[0])
  scorer = PasskeyScorer(model_config, batch_size=8, chunk_len=CHUNK, mesh=mesh, rules=rules,
                         param_shardings=sharding.replicated(mesh))
  return grid, documents, scorer.score(params, [d for _, _, d in documents], BOS, PAD)


@pytest.mark.parametrize('label, per_layer', [('xl:40', 40), ('attendre_fifo:40', 40),
                                              ('trained:40', 40), ('knn:96', None)])
def test_memory_held_is_the_configured_size_at_every_length(one_layer_model, label, per_layer):
  """Documents of 128, 256 and 512 tokens (whole chunks with BOS): a FIFO of 40 holds 40
  whatever the length; the kNN memory of 96 holds min(tokens read, 96)
  after the document; the state's bytes do not change with the length."""
  grid, documents, scores = _score_grid(
      one_layer_model, f'lengths=128,256,512;depths=0,100;documents=2;memories={label}')
  cells = passkey_grid.cell_rows(grid.memories[0], documents, scores)
  for cell in cells:
    want = per_layer if per_layer is not None else min(cell['length'], 96)
    assert cell['memory_entries'] == want == cell['memory_entries_max'], cell
    assert cell['seconds_per_1k_tokens'] > 0
  assert len({c['memory_bytes'] for c in cells}) == 1
  model_config = passkey_grid.memory_model_config(one_layer_model[0], VOCAB, grid.memories[0])
  shapes = jax.eval_shape(lambda: DecoderLM.init_state(model_config, 8))
  by_hand = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))
  assert cells[0]['memory_bytes'] == by_hand // 8


@pytest.mark.parametrize('memories, want', [('knn:512;top_k=512', 1.0), ('knn:96', 0.0)])
def test_needle_in_top_k_counts_answer_queries_that_retrieve_the_needle(one_layer_model,
                                                                        memories, want):
  """Needle at depth 0 of 512 tokens, chunk 64: a kNN memory of the whole document (512
  entries) returning every entry (top_k >= entries) hands every answer query the needle, whose share of what a
  query retrieves is then the needle's length over the 448 tokens of the 7 chunks before the
  answer's; a FIFO of 96 entries has evicted it long before the question, whatever the
  random model's scores."""
  grid, documents, scores = _score_grid(
      one_layer_model, f'lengths=512;depths=0;documents=2;memories={memories}')
  (cell,) = passkey_grid.cell_rows(grid.memories[0], documents, scores)
  assert cell['needle_in_top_k'] == want
  needle_len = documents[0][2].needle_len
  assert cell['needle_share'] == pytest.approx(want * needle_len / 448, rel=1e-6)


def test_no_needle_count_without_a_knn_layer(one_layer_model):
  grid, documents, scores = _score_grid(
      one_layer_model, 'lengths=128;depths=0;documents=1;memories=xl:40')
  assert 'needle_retrieved' not in scores and 'needle_share' not in scores
  assert 'needle_in_top_k' not in passkey_grid.cell_rows(grid.memories[0], documents, scores)[0]

"""The train step on 8 fake CPU devices equals the single-device step."""

import functools
import jax
import numpy as np
import pytest

from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization, steps
from longformer_jax.train import optimizer as optimizer_lib
from tests.support.tiny_models import VOCAB, stream_batch, tiny_config
from longformer_jax.models.resolved_model import lm_model_config

CHUNK = 8
pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (fake) devices')


def two_steps(mesh_shape, attention='xl', chunk=CHUNK, method='ring', hlo=None, **overrides):
  """Runs two train steps on a mesh; returns host copies of state and metrics.

  `hlo`: a list to which the compiled step's HLO text is appended.
  """
  config = tiny_config(attention=attention, num_heads=8, head_dim=4, **overrides)
  config.parallel.sequence_parallel = method
  if attention == 'vanilla':
    config.model.mem_len = 0     # the in-chunk softmax, which the sequence axis splits
  # Adam's first updates are ~lr * sign(g): for gradients near zero (e.g.
  # W_kR rows fed by low-frequency sinusoids) float reduction noise between
  # layouts would flip signs. A large eps makes the update linear in g, so
  # parameters can be compared tightly.
  config.optimizer.eps = 1e-2
  model = DecoderLM(lm_model_config(config.model, VOCAB))
  tx = optimizer_lib.make_optimizer(config.optimizer, 10)
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = make_mesh(mesh_shape, devices)
  rules = config.parallel.logical_axis_rules
  state, shardings = initialization.sharded_train_state(model, tx, 0, 8, chunk, mesh, rules)
  batch_sharding = sharding.batch_sharding(mesh, rules)
  step = jax.jit(
      functools.partial(steps.train_step, model=model, optimizer=tx, chunk_len=chunk,
                 learning_rate_fn=optimizer_lib.learning_rate_schedule(config.optimizer, 10)),
      in_shardings=(shardings, batch_sharding),
      out_shardings=(shardings, sharding.replicated(mesh)), donate_argnums=0)
  with sharding.activation_sharding(mesh, rules, config.parallel):
    for seed in (0, 1):
      batch = sharding.to_global_batch(stream_batch(8, 2 * chunk, seed=seed, doc_len=9),
                                       batch_sharding)
      if hlo is not None and seed == 0:
        hlo.append(step.lower(state, batch).compile().as_text())
      state, metrics = step(state, batch)
  return jax.device_get(state), jax.device_get(metrics), shardings


@pytest.fixture(scope='module')
def single_device():
  return two_steps((1, 1, 1))


@pytest.mark.parametrize('mesh_shape', [(8, 1, 1), (2, 2, 2), (1, 1, 8), (1, 8, 1)])
def test_sharded_step_matches_single_device(single_device, mesh_shape):
  ref_state, ref_metrics, _ = single_device
  state, metrics, shardings = two_steps(mesh_shape)
  leaf_sharding = jax.tree_util.tree_leaves(shardings.params)[0]
  assert len(leaf_sharding.device_set) > 1 or mesh_shape[0] == 8   # really sharded
  for name in ('loss', 'grad_norm'):
    np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         state.params, ref_state.params)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         state.memory, ref_state.memory)


# ---- the sequence axis: a chunk split along its length (sequence_parallel/attention.py) ----

@pytest.fixture(scope='module')
def single_device_vanilla():
  return two_steps((1, 1, 1), attention='vanilla', chunk=16)


@pytest.mark.parametrize('mesh_shape, method', [
    ((2, 1, 1, 4), 'ring'), pytest.param((1, 1, 1, 8), 'ring', marks=pytest.mark.slow),
    pytest.param((2, 1, 1, 4), 'all_gather', marks=pytest.mark.slow)])
def test_sequence_sharded_step_matches_single_device(single_device_vanilla, mesh_shape, method):
  """Two whole train steps (documents starting mid-chunk, zigzag load balancing) with the
  chunk split over the sequence axis equal the single-device steps; the compiled step
  really exchanges keys (collective-permute for the ring, all-gather otherwise); the default
  rules share the parameters over the sequence axis (`embed` on fsdp x sequence)."""
  ref_state, ref_metrics, _ = single_device_vanilla
  hlo = []
  state, metrics, shardings = two_steps(mesh_shape, attention='vanilla', chunk=16,
                                        method=method, hlo=hlo)
  embedding = shardings.params['embedding']['embedding']       # [vocab, embed]
  assert embedding.spec[1] == ('fsdp', 'sequence')
  assert embedding.shard_shape(state.params['embedding']['embedding'].shape)[1] == \
      state.params['embedding']['embedding'].shape[1] // mesh_shape[3]
  collective = 'collective-permute' if method == 'ring' else 'all-gather'
  assert collective in hlo[0]
  for name in ('loss', 'grad_norm'):
    np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         state.params, ref_state.params)


LONGFORMER = dict(longformer={'window': 4, 'window_cache': False})


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.slow
def test_sequence_sharded_longformer_window_matches_single_device(causal):
  """The sliding window split over data 2 x sequence 4 (a halo of 4 tokens from each
  neighbour of a 4-token shard) trains like one device, causal or two-sided."""
  ref_state, ref_metrics, _ = two_steps((1, 1, 1), attention='longformer', chunk=16,
                                        causal=causal, **LONGFORMER)
  hlo = []
  state, metrics, _ = two_steps((2, 1, 1, 4), attention='longformer', chunk=16, hlo=hlo,
                                causal=causal, **LONGFORMER)
  assert 'collective-permute' in hlo[0]
  for name in ('loss', 'grad_norm'):
    np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         state.params, ref_state.params)

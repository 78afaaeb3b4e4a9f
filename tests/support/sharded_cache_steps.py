"""Two train steps of a vanilla decoder with a cache on a mesh (the chunk split over the
`sequence` axis or not), and the check that they match the single-device steps."""

import functools

import jax
import numpy as np

from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization, steps
from longformer_jax.train import optimizer as optimizer_lib
from tests.support.tiny_models import VOCAB, stream_batch, tiny_config

CHUNK, MEM_LEN = 16, 8


def two_steps(mesh_shape, method='ring', hlo=None):
  """Two train steps (two chunks each, the cache carried between them) on a mesh.

  Returns host copies of the state and metrics; `hlo`: a list to which the
  compiled step's HLO text is appended.
  """
  config = tiny_config(attention='vanilla', num_heads=8, head_dim=4, mem_len=MEM_LEN)
  config.parallel.sequence_parallel = method
  config.optimizer.eps = 1e-2     # updates linear in g (tests/parallel/test_sharded_train_step.py)
  model = DecoderLM(lm_model_config(config.model, VOCAB))
  tx = optimizer_lib.make_optimizer(config.optimizer, 10)
  mesh = make_mesh(mesh_shape, jax.devices()[:int(np.prod(mesh_shape))])
  rules = config.parallel.logical_axis_rules
  state, shardings = initialization.sharded_train_state(model, tx, 0, 8, CHUNK, mesh, rules)
  batch_sharding = sharding.batch_sharding(mesh, rules)
  step = jax.jit(
      functools.partial(steps.train_step, model=model, optimizer=tx, chunk_len=CHUNK,
                        learning_rate_fn=optimizer_lib.learning_rate_schedule(config.optimizer,
                                                                              10)),
      in_shardings=(shardings, batch_sharding),
      out_shardings=(shardings, sharding.replicated(mesh)), donate_argnums=0)
  with sharding.activation_sharding(mesh, rules, config.parallel):
    for seed in (0, 1):
      # Documents of 9 tokens: some start mid-chunk, so the cache is partly another document's.
      batch = sharding.to_global_batch(stream_batch(8, 2 * CHUNK, seed=seed, doc_len=9),
                                       batch_sharding)
      if hlo is not None and seed == 0:
        hlo.append(step.lower(state, batch).compile().as_text())
      state, metrics = step(state, batch)
  return jax.device_get(state), jax.device_get(metrics)


def assert_steps_match(state, metrics, reference, method, hlo):
  """Loss, gradient norm, parameters and carried memory equal `reference`'s (state,
  metrics); the compiled step `hlo[0]` holds the method's collective."""
  ref_state, ref_metrics = reference
  assert ('collective-permute' if method == 'ring' else 'all-gather') in hlo[0]
  for name in ('loss', 'grad_norm'):
    np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree_util.tree_map(close, state.params, ref_state.params)
  jax.tree_util.tree_map(close, state.memory, ref_state.memory)

"""The Routing Transformer layer and its non-gradient model state (the k-means centroids).

- The layer (projections, RoPE, local heads, routing heads with the layer's own
  centroids) against a float64 reference built from the pair rules of
  tests/attention/test_routing.py and a Python-loop window mask for the local heads.
- The centroids move only when `model_state` is mutable and the context is
  not deterministic, by the EMA of the routing vectors (numpy reference).
- The train step threads the model state through the chunks of a step (equal
  to applying the chunks one at a time) and through gradient accumulation;
  the optimizer never sees the centroids; eval reads them.
- A checkpoint holds the model state; a checkpoint written before the train
  state had `model_state` still restores.
"""

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.routing import attention as routing
from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.train import optimizer as optimizer_lib
from longformer_jax.train import steps
from longformer_jax.train.initialization import init_variables
from longformer_jax.train.lm_objective import chunk_context, lm_sums, lm_sums_with_state
from longformer_jax.train.train_state import TrainState
from tests.support.performer_reference import numpy_rotate
from tests.support.routing_reference import reference_attention, reference_mask
from tests.support.tiny_models import shared_settings, stream_batch, tiny_config, tiny_model_config

B, N, D_MODEL, H, HD = 2, 12, 32, 3, 8
LOCAL, CLUSTERS, WINDOW, LOCAL_WINDOW = 1, 3, 4, 3
CHUNK = 8
# Tiny programs: compile fast rather than run fast (as tests/support/fast_compile.py).
FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE)
SETTINGS = dict(attention='routing', aux_loss_weights={'commitment_loss': 0.01},
                routing=dict(num_clusters=2, window=4, local_window=3, local_heads=1))


@flax.struct.dataclass
class _OlderTrainState:
  """The train state's layout before it had `model_state`."""
  step: Any
  params: Any
  opt_state: Any
  memory: Any
  rng: Any


def layer_and_context(causal: bool):
  layer = routing.RoutingAttention(
      config=routing.RoutingConfig(num_clusters=CLUSTERS, window=WINDOW, local_heads=LOCAL,
                                   local_window=LOCAL_WINDOW, decay=0.8),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D_MODEL, causal=causal))
  positions = np.tile(np.arange(30, 30 + N, dtype=np.int32), (B, 1))
  segments = np.zeros((B, N), np.int32)
  segments[1, 5:] = 1
  valid = np.ones((B, N), bool)
  valid[0, -2:] = False
  ctx = AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                         reset=jnp.zeros((B,), bool), valid=jnp.asarray(valid))
  x = jax.random.normal(jax.random.PRNGKey(2), (B, N, D_MODEL))
  variables = jit(layer.init)(jax.random.PRNGKey(1), x, {}, ctx)
  return layer, x, ctx, nn.meta.unbox(variables), (positions, segments, valid)


def numpy_unit(x):
  return x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)


def local_mask(positions, segments, valid, causal):
  """`[B, 1, n, n]` bool: the local heads' window, one pair at a time."""
  mask = np.zeros((B, 1, N, N), bool)
  for r in range(B):
    for i in range(N):
      for j in range(N):
        near = 0 <= positions[r, i] - positions[r, j] <= LOCAL_WINDOW if causal else \
            abs(positions[r, i] - positions[r, j]) <= LOCAL_WINDOW
        mask[r, 0, i, j] = near and valid[r, j] and segments[r, i] == segments[r, j]
  return mask


def test_layer_matches_float64_reference():
  for causal in (True, False):
    layer, x, ctx, variables, (positions, segments, valid) = layer_and_context(causal)
    y, _, aux = jit(layer.apply)(variables, x, {}, ctx)
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), variables['params'])
    x64 = np.asarray(x, np.float64)
    project = lambda name: np.einsum('bnd,dhe->bnhe', x64, p[name]['kernel'])  # noqa: E731
    rel = positions - positions[:, :1]
    z, v = project('query'), project('value')
    rotated = numpy_rotate(z, rel)
    q = rotated / np.sqrt(HD)
    local = reference_attention(q[:, :, :LOCAL], numpy_rotate(project('key'), rel),
                                v[:, :, :LOCAL], local_mask(positions, segments, valid, causal))
    centroids = np.asarray(variables[MODEL_STATE]['centroids'], np.float64)
    route = numpy_unit(z[:, :, LOCAL:])
    clusters = np.argmax(np.einsum('bnhd,hcd->bnhc', route, centroids), -1)
    mask = reference_mask(clusters, positions, segments, valid, WINDOW, causal)
    routed = reference_attention(q[:, :, LOCAL:], rotated[:, :, LOCAL:], v[:, :, LOCAL:], mask)
    out = np.concatenate([local, routed], axis=2)
    expected = np.einsum('bnhe,hed->bnd', out, p['out']['kernel'])
    real = valid[:, :, None]
    np.testing.assert_allclose(np.asarray(y) * real, expected * real, rtol=1e-4, atol=1e-5)
    chosen = centroids[np.arange(H - LOCAL)[None, None], clusters]             # [b, n, h, d]
    commitment = np.sum((route - chosen) ** 2, -1)[valid].mean()
    np.testing.assert_allclose(float(aux['commitment_loss']), commitment, rtol=1e-4)


def test_centroids_move_by_the_ema_only_when_training_with_mutable_state():
  layer, x, ctx, variables, (_, _, valid) = layer_and_context(True)
  before = np.asarray(variables[MODEL_STATE]['centroids'], np.float64)
  train_ctx = ctx.replace(deterministic=False)
  apply = jit(functools.partial(layer.apply, mutable=[MODEL_STATE]))
  _, updated = apply(variables, x, {}, train_ctx)
  after = np.asarray(updated[MODEL_STATE]['centroids'], np.float64)
  z = np.einsum('bnd,dhe->bnhe', np.asarray(x, np.float64),
                np.asarray(variables['params']['query']['kernel'], np.float64))
  route = numpy_unit(z[:, :, LOCAL:])
  clusters = np.argmax(np.einsum('bnhd,hcd->bnhc', route, before), -1)
  for head in range(H - LOCAL):
    for c in range(CLUSTERS):
      members = route[:, :, head][(clusters[:, :, head] == c) & valid]
      if len(members) == 0:
        np.testing.assert_allclose(after[head, c], before[head, c], rtol=1e-6)
        continue
      moved = 0.8 * before[head, c] + 0.2 * members.mean(0)
      np.testing.assert_allclose(after[head, c], moved / np.linalg.norm(moved), rtol=1e-4,
                                 atol=1e-5)
  assert not np.allclose(after, before)
  # Evaluation (deterministic) or a caller that does not make it mutable: unchanged.
  _, kept = apply(variables, x, {}, ctx)
  np.testing.assert_array_equal(kept[MODEL_STATE]['centroids'], before.astype(np.float32))
  jit(layer.apply)(variables, x, {}, train_ctx)       # read-only: no error, nothing written


@functools.lru_cache(maxsize=None)
def tiny_run():
  config = tiny_config(**SETTINGS)
  model_config = tiny_model_config(**SETTINGS)
  model = DecoderLM(model_config)
  variables = nn.meta.unbox(init_variables(model, jax.random.PRNGKey(0), 4, CHUNK))
  return config, model, variables


def train_state(config, variables, tx, batch_rows=4):
  params = variables['params']
  return TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                    memory=DecoderLM.init_state(DecoderLM(tiny_model_config(**SETTINGS)).config,
                                                batch_rows),
                    rng=jax.random.PRNGKey(1), model_state=variables[MODEL_STATE])


def run_train_step(accum: int):
  """`(state before, state after one train step, batch)` of the tiny routing model."""
  config, model, variables = tiny_run()
  tx = optimizer_lib.make_optimizer(config.optimizer, 10)
  state = train_state(config, variables, tx)
  batch = stream_batch(4, 2 * CHUNK, seed=6, doc_len=7)
  fn = functools.partial(steps.train_step, model=model, optimizer=tx,
                         learning_rate_fn=optimizer_lib.learning_rate_schedule(config.optimizer, 10),
                         chunk_len=CHUNK, grad_accum_steps=accum)
  new_state, metrics = jit(fn)(state, batch)
  assert np.isfinite(float(metrics['aux/commitment_loss']))
  assert not np.allclose(jax.tree_util.tree_leaves(new_state.model_state)[0],
                         jax.tree_util.tree_leaves(state.model_state)[0])
  assert len(jax.tree_util.tree_leaves(new_state.opt_state)) == len(
      jax.tree_util.tree_leaves(state.opt_state))
  return state, new_state, batch


def assert_trees_close(got, want):
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         got, want)


def test_train_step_threads_model_state_through_the_chunks():
  """The chunks one after another, each from the centroids the one before left."""
  _, model, variables = tiny_run()
  assert 'centroids' not in str(jax.tree_util.tree_structure(variables['params']))
  state, new_state, batch = run_train_step(accum=1)

  @jit
  def one_chunk(model_state, memory, chunk):
    (_, memory, _), updated = model.apply(
        {'params': variables['params'], MODEL_STATE: model_state}, chunk['inputs'], memory,
        chunk_context(chunk, deterministic=False), mutable=[MODEL_STATE],
        rngs={'dropout': jax.random.PRNGKey(0)})
    return updated[MODEL_STATE], memory
  expected, memory = variables[MODEL_STATE], state.memory
  for c in range(2):
    chunk = {k: jnp.asarray(v[:, c * CHUNK:(c + 1) * CHUNK]) for k, v in batch.items()}
    expected, memory = one_chunk(expected, memory, chunk)
  assert_trees_close(new_state.model_state, expected)


@pytest.mark.slow
def test_train_step_threads_model_state_through_gradient_accumulation():
  """Micro-batch 0's chunks, then micro-batch 1's, from where they left off."""
  _, model, variables = tiny_run()
  state, new_state, batch = run_train_step(accum=2)
  micro = steps.split_rows(batch, 2, row_axis=0)
  micro_memory = steps.split_rows(state.memory, 2, row_axis=0)
  micro_sums = jit(lambda model_state, memory, batch: lm_sums_with_state(
      model, variables['params'], model_state, memory, batch, CHUNK, deterministic=False,
      rng=jax.random.PRNGKey(0))[1])
  expected = variables[MODEL_STATE]
  for m in range(2):
    expected = micro_sums(expected, jax.tree_util.tree_map(lambda a: a[m], micro_memory),
                          jax.tree_util.tree_map(lambda a: jnp.asarray(a[m]), micro))
  assert_trees_close(new_state.model_state, expected)


def test_evaluation_reads_the_model_state():
  _, model, variables = tiny_run()
  batch = {k: jnp.asarray(v) for k, v in stream_batch(4, 2 * CHUNK, seed=8).items()}
  memory = DecoderLM.init_state(model.config, 4)
  sums_of = jit(lambda model_state: lm_sums(model, variables['params'], memory, batch, CHUNK,
                                            model_state=model_state)[1])
  sums = sums_of(variables[MODEL_STATE])
  # Every centroid of a head made its first: one cluster, another partition of the tokens.
  other = jax.tree_util.tree_map(lambda c: jnp.broadcast_to(c[:, :1], c.shape),
                                 variables[MODEL_STATE])
  other_sums = sums_of(other)
  assert float(sums['loss_sum']) != float(other_sums['loss_sum'])


def test_checkpoint_holds_model_state_and_older_checkpoints_restore(tmp_path):
  config, _, variables = tiny_run()
  tx = optimizer_lib.make_optimizer(config.optimizer, 10)
  state = train_state(config, variables, tx)
  abstract = lambda tree: jax.tree_util.tree_map(  # noqa: E731
      lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a),
                                     sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
      tree)
  with Checkpointer(str(tmp_path / 'new'), 2, async_save=False) as checkpointer:
    checkpointer.save(1, state, {'position': 1})
    restored, _ = checkpointer.restore(None, abstract(state))
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored.model_state, state.model_state)
  # A train state saved without the field (older runs): restores with model_state {}.
  without = {f: getattr(state, f) for f in ('step', 'params', 'opt_state', 'memory', 'rng')}
  older = _OlderTrainState(**without)
  with Checkpointer(str(tmp_path / 'old'), 2, async_save=False) as checkpointer:
    checkpointer.save(1, older, {'position': 1})
    restored, _ = checkpointer.restore(None, abstract(state.replace(model_state={})))
  assert restored.model_state == {}
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored.params, state.params)

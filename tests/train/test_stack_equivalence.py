"""Remat policies, layer scan and gradient accumulation change cost, not math.

Every remat policy gives the same loss and gradients, and is seen to be applied
(its checkpoint equations are in the jaxpr), so a policy that is dropped fails.
"""

import functools
import jax
import numpy as np
import pytest

from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.param_layout import scan_layout, unrolled_layout
from longformer_jax.parallel.remat import REMAT_POLICIES
from longformer_jax.train import optimizer as optimizer_lib
from longformer_jax.train import steps
from longformer_jax.train.initialization import init_params
from longformer_jax.train.lm_objective import lm_sums
from longformer_jax.train.train_state import TrainState
import flax.linen as nn
from tests.support.remat_equations import remat_policies_in
from tests.support.tiny_models import stream_batch, tiny_config, tiny_model_config

CHUNK = 8


def mean_loss(model_config, batch):
  """The token-mean loss over the batch's chunks as a function of the parameters."""
  model = DecoderLM(model_config)
  memory = DecoderLM.init_state(model_config, batch['inputs'].shape[0])

  def loss(p):
    _, sums = lm_sums(model, p, memory, batch, CHUNK)
    return sums['loss_sum'] / sums['tokens']
  return loss


def loss_and_grads(model_config, params, batch):
  return jax.jit(jax.value_and_grad(mean_loss(model_config, batch)))(params)


@pytest.fixture(scope='module')
def reference():
  config = tiny_model_config(attention='xl')
  params = nn.meta.unbox(init_params(DecoderLM(config), jax.random.PRNGKey(0), 2, CHUNK))
  batch = stream_batch(2, 3 * CHUNK, seed=3, doc_len=11)
  loss, grads = loss_and_grads(config, params, batch)
  return params, batch, loss, grads


@pytest.mark.parametrize('scan_layers', [False, True])
@pytest.mark.parametrize('policy', sorted(REMAT_POLICIES))
def test_remat_and_scan_give_same_loss_and_grads(reference, policy, scan_layers):
  params, batch, ref_loss, ref_grads = reference
  config = tiny_model_config(attention='xl', remat_policy=policy, scan_layers=scan_layers)
  num_layers = config.num_layers
  layout = (lambda p: scan_layout(p, num_layers)) if scan_layers else (lambda p: p)
  loss, grads = loss_and_grads(config, layout(params), batch)
  if scan_layers:
    grads = unrolled_layout(grads, num_layers)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                         grads, ref_grads)
  # Same math whatever the policy, so the policy must be seen to be applied: one
  # checkpoint per block (one around the scanned layers) carrying exactly this
  # policy, none without remat (test_contract_stacks.py checks what each saves).
  found = remat_policies_in(jax.make_jaxpr(mean_loss(config, batch))(layout(params)).jaxpr)
  expected = 0 if policy == 'none' else (1 if scan_layers else num_layers)
  assert len(found) == expected, f'{policy}: {len(found)} checkpoints, expected {expected}'
  assert all(f is REMAT_POLICIES[policy] for f in found), f'{policy} not applied: {found}'


def test_param_layouts_round_trip(reference):
  params = reference[0]
  back = unrolled_layout(scan_layout(params, 2), 2)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)


def test_grad_accumulation_matches_full_batch():
  config = tiny_config(attention='xl')
  model_config = tiny_model_config(attention='xl')
  model = DecoderLM(model_config)
  tx = optimizer_lib.make_optimizer(config.optimizer, 10)
  params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(0), 4, CHUNK))
  # Start from a non-empty memory so that splitting memory rows is exercised.
  batch = stream_batch(4, 2 * CHUNK, seed=5, doc_len=7)
  warm_memory, _ = lm_sums(model, params, DecoderLM.init_state(model_config, 4), batch, CHUNK)
  state = TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                     memory=warm_memory, rng=jax.random.PRNGKey(1))
  results = []
  for accum in (1, 2, 4):
    fn = functools.partial(steps.train_step, model=model, optimizer=tx,
                    learning_rate_fn=optimizer_lib.learning_rate_schedule(config.optimizer, 10),
                    chunk_len=CHUNK, grad_accum_steps=accum)
    results.append(jax.jit(fn)(state, stream_batch(4, 2 * CHUNK, seed=6, doc_len=7)))
  (ref_state, ref_metrics), others = results[0], results[1:]
  for new_state, metrics in others:
    np.testing.assert_allclose(metrics['loss'], ref_metrics['loss'], rtol=1e-6)
    np.testing.assert_allclose(metrics['grad_norm'], ref_metrics['grad_norm'], rtol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                           new_state.params, ref_state.params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                           new_state.memory, ref_state.memory)

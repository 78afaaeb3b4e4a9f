"""The jaxpr matmul count against counts made by hand, and against the analytic model count."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from benchmarks.program_flops import dot_general_flops, program_flops
from longformer_jax.models.flop_count import train_flops_per_token

B, D, LAYERS = 8, 64, 3


def _stack(w, x, remat: bool):
  def layer(h, wl):
    apply = (lambda h: jnp.tanh(h @ wl))
    return (jax.checkpoint(apply) if remat else apply)(h), None
  return jax.lax.scan(layer, x, w)[0].sum()


def test_dot_general_counts_batch_free_and_contracted_axes():
  # [b=3, m=4, k=5] x [b=3, k=5, n=6] -> 2*3*4*5*6
  numbers = (((2,), (1,)), ((0,), (0,)))
  assert dot_general_flops((3, 4, 5), (3, 5, 6), numbers) == 2 * 3 * 4 * 5 * 6
  # a plain matmul [4, 5] x [5, 6]
  assert dot_general_flops((4, 5), (5, 6), (((1,), (0,)), ((), ()))) == 2 * 4 * 5 * 6


@pytest.mark.parametrize('remat, matmuls_per_layer', [(False, 3), (True, 4)])
def test_scan_multiplies_and_remat_recomputes(remat, matmuls_per_layer):
  """Forward 1 matmul per layer; backward 2 (d_input, d_weight) and, rematerialised, the
  forward again: 3 or 4 matmuls of [B, D] x [D, D] per layer of the scan."""
  w, x = jnp.ones((LAYERS, D, D)), jnp.ones((B, D))
  counted = program_flops(jax.grad(functools.partial(_stack, remat=remat)), w, x)
  assert counted.matmul_flops == matmuls_per_layer * LAYERS * 2 * B * D * D
  assert counted.while_loops == 0


def test_cond_counts_its_costliest_branch_and_while_is_reported():
  def f(x, flag):
    y = jax.lax.cond(flag, lambda v: (v @ v) @ v, lambda v: v @ v, x)
    return jax.lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] @ x, c[1] + 1), (y, 0))[0]
  x = jnp.ones((D, D))
  counted = program_flops(f, x, True)
  assert counted.matmul_flops == 3 * 2 * D ** 3      # two in the branch, one loop body
  assert counted.while_loops == 1


def test_shard_map_counts_every_device():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ('x',))

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P('x'), P()), out_specs=P('x'))
  def f(x, w):
    return x @ w
  x, w = jnp.ones((8 * B, D)), jnp.ones((D, D))
  assert program_flops(f, x, w).matmul_flops == 2 * 8 * B * D * D


def test_xl_train_step_without_remat_is_about_three_forward_passes():
  """The whole XL train step, counted from its program, against `flop_count`'s analytic
  3 x forward (which approximates the backward as twice the forward: the memory's
  re-projection has no input gradient, so the program is a little below it)."""
  import memory_check  # deferred: a root script, imported where used as in its own tests
  import ml_collections
  from longformer_jax.experiment_config import validate_config
  from longformer_jax.models.resolved_model import lm_model_config
  values = {'model': {'attention': 'xl', 'num_layers': 2, 'd_model': 64, 'num_heads': 4,
                      'head_dim': 16, 'd_ff': 128, 'mem_len': 32, 'remat_policy': 'none',
                      'tie_embeddings': False},
            'data': {'batch_size': 4, 'chunk_len': 32, 'chunks_per_step': 2,
                     'eval_batch_size': 4},
            'train': {'num_steps': 10}, 'parallel': {'mesh_shape': (1, 1, 1)}}
  config = validate_config(ml_collections.ConfigDict(values))
  mesh, (phase,) = memory_check.phase_steps(config, jax.devices()[:1], vocab_size=256)
  counted = program_flops(phase.step, phase.state, phase.batch).matmul_flops
  tokens = 4 * 32 * 2
  analytic = train_flops_per_token(lm_model_config(config.model, 256), 32, 4) * tokens
  np.testing.assert_allclose(counted, analytic, rtol=0.1)
  assert counted <= analytic

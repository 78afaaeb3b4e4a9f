"""The attention-scaling benchmark times what it says: its cases agree with each other.

Each fast case of benchmarks/*_cases.py must give the outputs (and, for the
Longformer kernel, the gradients) of its dense-mask case at a small length,
with the benchmark's own shapes and windows; otherwise a speed-up would be
measured on a different computation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import longformer_cases, sparse_cases
from tests.support.gradient_checks import assert_gradients_match

N = 640   # not a multiple of the block size; longer than one window of 512


def _cases(module) -> dict:
  return {case.variant: case for case in module.CASES}


def _outputs(case, inputs):
  return np.asarray(jax.jit(case.forward)(*inputs))


def test_longformer_blocked_and_dense_cases_agree():
  cases = _cases(longformer_cases)
  inputs = cases['longformer_blocked'].make_inputs(N, jax.random.PRNGKey(0))
  blocked = _outputs(cases['longformer_blocked'], inputs)
  for dense in ('longformer_dense_mask', 'longformer_dense_mask_by_head'):
    np.testing.assert_allclose(blocked, _outputs(cases[dense], inputs), atol=2e-5, err_msg=dense)
  # Full causal attention differs once a query has more than 512 keys before it.
  assert np.abs(blocked - _outputs(cases['full_causal'], inputs)).max() > 1e-3


def test_longformer_blocked_case_gradients_match_dense():
  cases = _cases(longformer_cases)
  inputs = cases['longformer_blocked'].make_inputs(N, jax.random.PRNGKey(1))
  cotangent = jax.random.normal(jax.random.PRNGKey(2), inputs[0].shape)

  loss = lambda case: lambda *x: jnp.sum(case.forward(*x) * cotangent)
  assert_gradients_match(loss(cases['longformer_blocked']),
                         loss(cases['longformer_dense_mask_by_head']), inputs, rtol=0, atol=5e-5)


@pytest.mark.parametrize('name', ['sparse_strided', 'sparse_fixed', 'bigbird'])
def test_sparse_blocked_cases_equal_their_dense_masks(name):
  cases = _cases(sparse_cases)
  inputs = cases[f'{name}_blocked'].make_inputs(1024, jax.random.PRNGKey(3))
  np.testing.assert_allclose(_outputs(cases[f'{name}_blocked'], inputs),
                             _outputs(cases[f'{name}_dense_mask'], inputs), atol=2e-5)


def test_case_flops_count_the_band():
  case = _cases(longformer_cases)['longformer_blocked']
  # Causal window 512: query i sees min(i, 512) + 1 keys.
  pairs = sum(min(i, 512) + 1 for i in range(N))
  assert case.flops(N) == 4 * 8 * 64 * pairs

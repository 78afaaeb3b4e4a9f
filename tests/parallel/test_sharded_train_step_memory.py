"""Train steps of a vanilla decoder with a cache (`mem_len > 0`) with the chunk split over
the `sequence` axis equal the single-device steps (attention/sequence_parallel/, `memory`)."""

import jax
import pytest

from tests.support.sharded_cache_steps import assert_steps_match, two_steps

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (fake) devices')


@pytest.fixture(scope='module')
def single_device():
  return two_steps((1, 1, 1))


@pytest.mark.parametrize('method', ['ring', pytest.param('all_gather', marks=pytest.mark.slow)])
def test_sequence_sharded_step_with_memory_matches_single_device(single_device, method):
  """data 2 x sequence 4, zigzag load balancing: loss, gradient norm, parameters and the
  carried cache equal the single-device steps; the compiled step exchanges keys."""
  hlo = []
  state, metrics = two_steps((2, 1, 1, 4), method=method, hlo=hlo)
  assert_steps_match(state, metrics, single_device, method, hlo)



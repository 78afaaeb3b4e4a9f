"""Attendre's time-shifted stack (delayed queries per layer) against the standard stack.

With memories holding everything, the time-shifted stack after a flush equals
a bidirectional encoder (the standard stack with vanilla attention over the
whole input); finishing by draining (padding chunks) equals flushing, with a
different Q-memory delay in each layer.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.models import attendre_delay
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.standard_stack import BlockStack
from longformer_jax.models.resolved_model import ResolvedModel, resolved_model
from tests.support.attendre_reference import B, C, D, H, HD, context, stream

_STEPS = {}


def stack_config(**overrides) -> ResolvedModel:
  """A resolved 2-layer time-shifted stack; `overrides` are keys of `model.attendre`
  (memory_size 16), and `layer_schedule` the model's."""
  schedule = overrides.pop('layer_schedule', {})
  values = dict(num_layers=2, d_model=D, num_heads=H, head_dim=HD, d_ff=32,
                attention='attendre', stack='attendre_delay', causal=False,
                layer_schedule=schedule, attendre=dict({'memory_size': 16}, **overrides))
  return resolved_model(resolve_model(values))


def stack_step(config):
  """A jitted `(params, x, states, ctx) -> (y, states)` of the time-shifted stack (cached)."""
  if config not in _STEPS:
    stack = attendre_delay.TimeShiftedStack(config, jnp.float32)
    _STEPS[config] = jax.jit(lambda p, x, s, ctx: stack.apply({'params': p}, x, s, ctx)[:2])
  return _STEPS[config]


def init_stack_params(config, seed, x, positions, segments, valid):
  """Parameters of the time-shifted stack (named like the standard stack's)."""
  stack = attendre_delay.TimeShiftedStack(config, jnp.float32)
  ctx = context(positions[:, :C], segments[:, :C], valid[:, :C], np.ones(B, bool))
  return jax.jit(stack.init)(jax.random.PRNGKey(seed), jnp.asarray(x[:, :C]),
                             attendre_delay.TimeShiftedStack.init_state(config, B), ctx)['params']


def run_stack(config, params, x, positions, segments, valid, finish):
  """The time-shifted stack over whole chunks then `finish`; outputs aligned to the input."""
  apply = stack_step(config)
  states = attendre_delay.TimeShiftedStack.init_state(config, B)
  outputs, total = [], x.shape[1]
  for start in range(0, total, C):
    part = slice(start, start + C)
    ctx = context(positions[:, part], segments[:, part], valid[:, part], np.full(B, start == 0))
    y, states = apply(params, jnp.asarray(x[:, part]), states, ctx)
    outputs.append(np.asarray(y))
  for length in attendre_delay.finishing_lengths(config, C, finish):
    ctx = attendre_delay.padding_context(ctx, length)
    y, states = apply(params, jnp.zeros((B, length, D)), states, ctx)
    outputs.append(np.asarray(y))
  delay = attendre_delay.total_delay(config)
  return np.concatenate(outputs, axis=1)[:, delay:delay + total]


def test_time_shifted_stack_with_big_memories_equals_a_bidirectional_encoder():
  total = 16
  config = stack_config(q_memory_size=total, memory_size=total)
  x, positions, segments, valid = stream(total, seed=7)
  params = init_stack_params(config, 2, x, positions, segments, valid)
  y = run_stack(config, params, x, positions, segments, valid, 'flush')
  # The reference: the standard stack, vanilla bidirectional attention over the whole input.
  dense = dataclasses.replace(config, attention='vanilla')
  expected, _, _ = jax.jit(BlockStack(dense, jnp.float32).apply)(
      {'params': params}, jnp.asarray(x), BlockStack.init_state(dense, B),
      context(positions, segments, valid, np.ones(B, bool)))
  np.testing.assert_allclose(y, np.asarray(expected), rtol=2e-4, atol=2e-5)


def test_time_shifted_stack_drain_equals_flush_with_per_layer_delays():
  total = 24
  config = stack_config(q_memory_size=6, memory_size=8, policy='lra_max',
                        layer_schedule={'attendre': {'q_memory_size': '6,4'}})
  assert attendre_delay.total_delay(config) == 10
  assert attendre_delay.finishing_lengths(config, C, 'drain') == [C, C]
  x, positions, segments, valid = stream(total, seed=8, doc_len=10)
  params = init_stack_params(config, 3, x, positions, segments, valid)
  flushed = run_stack(config, params, x, positions, segments, valid, 'flush')
  drained = run_stack(config, params, x, positions, segments, valid, 'drain')
  np.testing.assert_allclose(flushed, drained, rtol=1e-5, atol=1e-6)
  # Every output is a real token's: the skip path carried its input through.
  assert (np.abs(flushed).max(axis=-1) > 0.1).all()

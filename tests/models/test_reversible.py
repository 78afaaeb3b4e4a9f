"""Reversible residual layers (Reformer sec. 4) against residual blocks computed directly.

The reference runs y1 = x1 + F(x2), y2 = x2 + G(y1) as a plain Python loop
that JAX differentiates by ordinary autodiff; the custom VJP must give the
same outputs, memories and gradients, and its backward memory must not grow
with depth the way an ordinary stack's does.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import train as train_script
from configs import reformer
from longformer_jax.config.overrides import merged
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.layers.reversible import reversible_sequence
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.reversible_stack import LayerAt, ReversibleConfig, ReversibleStack
from longformer_jax.models.stack_registry import stack_class
from tests.support.tiny_models import context_of, stream_batch, tiny_config, tiny_model_config

B, C = 2, 16


def toy_f(params, x, side):
  """Attention-like F with a dropout key, an int memory and an auxiliary loss."""
  key, memory = side
  keep = jax.random.bernoulli(key, 0.7, x.shape)
  h = jnp.where(keep, jnp.tanh(x @ params['w']) / 0.7, 0.0)
  return h, {'memory': memory + 1, 'aux': {'penalty_loss': jnp.mean(h ** 2)}}


def toy_g(params, x, side):
  return jnp.tanh(x @ params + side), ()


def test_reversible_sequence_matches_direct_residuals():
  keys = jax.random.split(jax.random.PRNGKey(0), 12)
  layers = 3
  params = tuple(({'w': jax.random.normal(keys[i], (8, 8)) / 3},
                  jax.random.normal(keys[i + 3], (8, 8)) / 3) for i in range(layers))
  sides = tuple(((keys[i + 6], jnp.arange(4) * i), jnp.full((8,), 0.1 * i)) for i in range(layers))
  x = jax.random.normal(keys[11], (B, 5, 8))
  cotangent = jax.random.normal(keys[10], (B, 5, 8))

  def objective(y1, y2, penalties):
    return jnp.sum(cotangent * y1) + jnp.sum(jnp.sin(y2)) + 0.5 * sum(penalties)

  def reversible(params, x):
    y1, y2, extras = reversible_sequence([(toy_f, toy_g)] * layers, params, x, x, sides)
    memories = [extra_f['memory'] for extra_f, _ in extras]
    return objective(y1, y2, [extra_f['aux']['penalty_loss'] for extra_f, _ in extras]), memories

  def direct(params, x):
    x1 = x2 = x
    penalties, memories = [], []
    for (pf, pg), (sf, sg) in zip(params, sides):
      h, extra = toy_f(pf, x2, sf)
      x1 = x1 + h
      x2 = x2 + toy_g(pg, x1, sg)[0]
      penalties.append(extra['aux']['penalty_loss'])
      memories.append(extra['memory'])
    return objective(x1, x2, penalties), memories

  (got, got_memories), got_grads = jax.value_and_grad(reversible, argnums=(0, 1), has_aux=True)(
      params, x)
  (want, want_memories), want_grads = jax.value_and_grad(direct, argnums=(0, 1), has_aux=True)(
      params, x)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for a, b in zip(got_memories, want_memories):
    np.testing.assert_array_equal(a, b)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5),
                         got_grads, want_grads)


def stack_setup(**overrides):
  config = tiny_model_config(stack='reversible', **overrides)
  batch = stream_batch(B, C, seed=1, doc_len=10)
  ctx = context_of(batch)
  x = jax.random.normal(jax.random.PRNGKey(2), (B, C, config.d_model))
  states = ReversibleStack.init_state(config, B)
  stack = ReversibleStack(config)
  params = stack.init(jax.random.PRNGKey(3), x, states, ctx)['params']
  return config, stack, params, x, states, ctx


def direct_stack(config, params, x, states, ctx):
  """y1 = x1 + F(x2), y2 = x2 + G(y1) layer by layer, ordinary autodiff."""
  x1 = x2 = x
  new_states = []
  for i in range(config.num_layers):
    layer_params = {'params': {f'layer_{i}': params[f'layer_{i}']}}
    layer = LayerAt(layer_config(config, i), jnp.float32, i)
    h, (state, _) = layer.apply(layer_params, x2, states[i], ctx, 'attention')
    x1 = x1 + h
    x2 = x2 + layer.apply(layer_params, x1, None, ctx, 'feed_forward')[0]
    new_states.append(state)
  return (x1 + x2) / 2, tuple(new_states)


STACK_CASE = dict(attention='lsh', layer_schedule={'attention': 'lsh,vanilla'}, mem_len=8,
                  ff_chunk_size=4, lsh_chunk_len=8, lsh_num_buckets=4)


def test_reversible_stack_matches_direct_blocks():
  """Layer 0 LSH (stateless), layer 1 vanilla with a memory; chunked feed-forward."""
  config, stack, params, x, states, ctx = stack_setup(**STACK_CASE)
  cotangent = jax.random.normal(jax.random.PRNGKey(4), x.shape)
  # Non-empty memories, so that the state inputs matter.
  _, states, _ = stack.apply({'params': params}, x * 0.5, states, ctx)

  def reversible(params, x):
    y, new_states, _ = stack.apply({'params': params}, x, states, ctx)
    return jnp.sum(cotangent * y), new_states

  def direct(params, x):
    y, new_states = direct_stack(config, params, x, states, ctx)
    return jnp.sum(cotangent * y), new_states

  (got, got_states), got_grads = jax.jit(jax.value_and_grad(reversible, (0, 1), has_aux=True))(
      params, x)
  (want, want_states), want_grads = jax.jit(jax.value_and_grad(direct, (0, 1), has_aux=True))(
      params, x)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got_states,
                         want_states)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4),
                         got_grads, want_grads)


def backward_temp_bytes(stack_name: str, num_layers: int) -> int:
  config = tiny_model_config(stack=stack_name, num_layers=num_layers, attention='vanilla',
                             mem_len=0, d_model=64, num_heads=2, head_dim=32, d_ff=256)
  batch, length = 2, 256
  x = jnp.zeros((batch, length, 64))
  ctx = context_of(stream_batch(batch, length))
  cls = stack_class(stack_name)
  states = cls.init_state(config, batch)
  module = cls(config)
  params = module.init(jax.random.PRNGKey(0), x, states, ctx)
  loss = lambda p, x: jnp.sum(module.apply(p, x, states, ctx)[0] ** 2)  # noqa: E731
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_backward_memory_does_not_grow_with_depth():
  reversible = [backward_temp_bytes('reversible', n) for n in (2, 8)]
  standard = [backward_temp_bytes('standard', n) for n in (2, 8)]
  # Measured on CPU (MB): reversible 5.1 -> 6.7, standard 10.8 -> 42.4.
  assert reversible[1] < 1.5 * reversible[0]
  assert standard[1] > 3 * standard[0]
  assert reversible[1] < standard[1] / 4


@pytest.mark.parametrize('key,value', [('scan_layers', True), ('remat_policy', 'full')])
def test_reversible_stack_config_errors(key, value):
  """The `reversible` section rejects shared settings the unrolled stack cannot honour."""
  with pytest.raises(ConfigError, match=rf'model\.{key}: {value!r}'):
    tiny_config(stack='reversible', **{key: value})
  tiny_config(stack='standard', **{key: value})      # the standard stack honours both


def test_reversible_stack_registers_its_section():
  assert ReversibleStack.Config is ReversibleConfig
  assert resolve_config({'model': {'stack': 'reversible'}})['model']['reversible'] == {}


@pytest.mark.slow  # a train.py smoke run; the layer tests cover the variant
def test_reformer_config_trains(tmp_path):
  # The LSH settings by their old flat names: they go to the `lsh` section.
  model, _ = migrate_flat_model(dict(num_layers=2, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                                     vocab_multiple=8, lsh_chunk_len=8, lsh_num_buckets=4,
                                     ff_chunk_size=8, dropout_rate=0.1))
  values = merged(reformer.get_config(), {
      'model': model,
      'data': dict(batch_size=8, chunk_len=32, chunks_per_step=1, eval_batch_size=8),
      'train': dict(num_steps=4, log_every=2, eval_every=0, checkpoint_every=4,
                    async_checkpointing=False, eval_max_tokens=512)})
  config = ml_collections.ConfigDict(resolve_config(values))
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 4 and np.isfinite(metrics['loss'])
  assert 0 < metrics['grad_norm'] < np.inf            # the custom VJP reaches the parameters
  assert all(np.isfinite(np.asarray(leaf)).all()
             for leaf in jax.tree_util.tree_leaves(state.params))

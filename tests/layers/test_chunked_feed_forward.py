"""Chunked feed-forward (Reformer sec. 4) against the unchunked layer and a numpy reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.layers.feed_forward import FeedForward, FeedForwardConfig
from longformer_jax.layers.linear import projection

B, D, F = 2, 16, 64


def feed_forward(d_ff: int = F, chunk_size: int = 0, dropout_rate: float = 0.0) -> FeedForward:
  """The layer with the default settings (FeedForwardConfig) but `d_ff` and the chunks."""
  return FeedForward(FeedForwardConfig(d_ff=d_ff, ff_chunk_size=chunk_size), D, dropout_rate)


class FeedForwardAsBefore(nn.Module):
  """The layer as it was before chunking was added (same names, same init)."""

  @nn.compact
  def __call__(self, x):
    h = projection(F, kernel_axes=('embed', 'mlp'), name='wi', use_bias=True, bias_axes=('mlp',))(x)
    return projection(D, kernel_axes=('mlp', 'embed'), name='wo', use_bias=True,
                      bias_axes=('embed',))(nn.gelu(h))


def numpy_feed_forward(params, x):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  h = np.float64(x) @ p['wi']['kernel'] + p['wi']['bias']
  h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))  # gelu (tanh form)
  return h @ p['wo']['kernel'] + p['wo']['bias']


def test_unchunked_keeps_parameter_names_and_init():
  x = jax.random.normal(jax.random.PRNGKey(0), (B, 12, D))
  before = FeedForwardAsBefore().init(jax.random.PRNGKey(1), x)
  for chunk_size in (0, 4):
    now = feed_forward(chunk_size=chunk_size).init(jax.random.PRNGKey(1), x)
    assert jax.tree_util.tree_structure(now) == jax.tree_util.tree_structure(before)
    jax.tree_util.tree_map(np.testing.assert_array_equal, now, before)


@pytest.mark.parametrize('length,chunk_size', [(16, 4), (18, 4), (8, 8), (6, 16)])
def test_chunked_equals_unchunked_and_reference(length, chunk_size):
  x = jax.random.normal(jax.random.PRNGKey(2), (B, length, D))
  params = feed_forward().init(jax.random.PRNGKey(3), x)
  cotangent = jax.random.normal(jax.random.PRNGKey(4), (B, length, D))

  def loss(module, params, x):
    return jnp.sum(cotangent * module.apply(params, x))

  plain, chunked = feed_forward(), feed_forward(chunk_size=chunk_size)
  np.testing.assert_allclose(plain.apply(params, x), numpy_feed_forward(params['params'], x),
                             atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(chunked.apply(params, x), plain.apply(params, x), atol=1e-6)
  want = jax.jit(jax.grad(lambda p, x: loss(plain, p, x), argnums=(0, 1)))(params, x)
  got = jax.jit(jax.grad(lambda p, x: loss(chunked, p, x), argnums=(0, 1)))(params, x)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                         got, want)


def test_chunked_dropout_is_applied_per_chunk():
  x = jax.random.normal(jax.random.PRNGKey(5), (B, 16, D))
  params = feed_forward().init(jax.random.PRNGKey(6), x)
  module = feed_forward(chunk_size=4, dropout_rate=0.5)
  train = module.apply(params, x, deterministic=False, rngs={'dropout': jax.random.PRNGKey(7)})
  again = module.apply(params, x, deterministic=False, rngs={'dropout': jax.random.PRNGKey(7)})
  np.testing.assert_array_equal(train, again)
  assert not np.allclose(train, module.apply(params, x))
  np.testing.assert_allclose(module.apply(params, x), feed_forward().apply(params, x), atol=1e-6)


def test_chunking_bounds_backward_memory():
  """The gradient's temporary memory shrinks when the hidden layer is chunked."""
  x = jnp.zeros((1, 2048, D))
  params = feed_forward(512).init(jax.random.PRNGKey(0), x[:, :8])

  def temp_bytes(chunk_size):
    module = feed_forward(512, chunk_size)
    loss = lambda p, x: jnp.sum(module.apply(p, x))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  hidden_bytes = 2048 * 512 * 4
  assert temp_bytes(0) >= hidden_bytes          # the [n, d_ff] activations are kept
  assert temp_bytes(128) < hidden_bytes / 2


def test_pre_ln_block_reads_ff_chunk_size():
  """`model.ff_chunk_size` reaches the default block; the function is unchanged."""
  import dataclasses
  from longformer_jax.memory import fifo
  from longformer_jax.models.pre_ln_block import DecoderBlock
  from tests.support.tiny_models import context_of, stream_batch, tiny_model_config
  plain = tiny_model_config()
  chunked = dataclasses.replace(plain, ff_chunk_size=3)
  x = jax.random.normal(jax.random.PRNGKey(5), (2, 8, plain.d_model))
  state = fifo.create(2, plain.mem_len, (plain.d_model,))
  ctx = context_of(stream_batch(2, 8))
  params = DecoderBlock(plain).init(jax.random.PRNGKey(0), x, state, ctx)['params']
  y_plain, _ = DecoderBlock(plain).apply({'params': params}, x, state, ctx)
  y_chunked, _ = DecoderBlock(chunked).apply({'params': params}, x, state, ctx)
  np.testing.assert_allclose(np.asarray(y_chunked), np.asarray(y_plain), atol=1e-5)
  jaxpr = str(jax.make_jaxpr(lambda v: DecoderBlock(chunked).apply({'params': params}, v, state, ctx))(x))
  assert 'scan' in jaxpr

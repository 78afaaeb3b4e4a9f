"""Image Transformer local 1D / 2D attention against dense-mask references built by Python loops.

The references never use the slot tables of the fast path: the 1D mask is
written from the query block's index, the 2D one from pixel coordinates
(row, column) recovered by walking the image block by block in block-raster
order, with the memory block of section 3.2 (the query block plus a flange
above, left and right) and "generated before" as a comparison of stream
indices. Attention is a float64 softmax; the fast path's outputs, and its
gradients against a differentiable dense-mask version, are held to it, with
a document boundary, padding and lengths that are and are not multiples of
the query block. These are the causal (generation) forms; the bidirectional
ones are in test_image_local_bidirectional.py.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.image_local import attention as image_local
from longformer_jax.config.errors import ConfigError
from longformer_jax.models.model_config import resolve_model
from tests.support.dense_mask_reference import dense_jax_attention, reference_layer
from tests.support.gradient_checks import assert_gradients_match
from tests.support.image_local_reference import B, D, H, HD, chunk_facts, context_for, section
from tests.support.tiny_models import shared_settings


def reference_1d_mask(positions, segments, valid, query_len, memory_len) -> np.ndarray:
  """`[batch, heads, n, n]`: key j in [block start - l_m, block end) and generated no later."""
  b, n = positions.shape
  allowed = np.zeros((b, H, n, n), bool)
  for row in range(b):
    for i in range(n):
      block_start = (i // query_len) * query_len
      for j in range(max(0, block_start - memory_len), min(n, block_start + query_len)):
        allowed[row, :, i, j] = (positions[row, j] <= positions[row, i] and valid[row, j]
                                 and segments[row, j] == segments[row, i])
  return allowed


def block_raster_coordinates(height, width, bh, bw) -> list:
  """(row, column) of each stream index, walking blocks in raster order, raster inside."""
  coords = []
  for block_row in range(height // bh):
    for block_col in range(width // bw):
      for r in range(bh):
        for c in range(bw):
          coords.append((block_row * bh + r, block_col * bw + c))
  return coords


def reference_2d_mask(positions, segments, valid, height, width, bh, bw, fh, fw) -> np.ndarray:
  b, n = positions.shape
  image = height * width
  coords = block_raster_coordinates(height, width, bh, bw)
  allowed = np.zeros((b, H, n, n), bool)
  for row in range(b):
    for s in range(n):
      qr, qc = coords[s % image]
      top, left = (qr // bh) * bh, (qc // bw) * bw          # the query block's corner
      for t in range(n):
        if t // image != s // image:
          continue
        kr, kc = coords[t % image]
        in_memory = top - fh <= kr < top + bh and left - fw <= kc < left + bw + fw
        allowed[row, :, s, t] = (in_memory and positions[row, t] <= positions[row, s]
                                 and valid[row, t] and segments[row, t] == segments[row, s])
  return allowed


# (section, n): 1D at a multiple of the query block and not, memory not a
# multiple of it; 2D one image and two images, flanges that leave the image.
CASES = [
    (section(layout='1d', query_len=4, memory_len=6), 16),
    (section(layout='1d', query_len=4, memory_len=6), 13),
    (section(layout='1d', query_len=5, memory_len=0), 12),
    (section(layout='2d', image_height=4, image_width=6, block_height=2, block_width=3,
             flange_height=1, flange_width=2), 24),
    (section(layout='2d', image_height=4, image_width=4, block_height=2, block_width=2,
             flange_height=2, flange_width=1), 32),
]


def reference_mask(cfg, positions, segments, valid):
  if cfg.layout == '1d':
    return reference_1d_mask(positions, segments, valid, cfg.query_len, cfg.memory_len)
  return reference_2d_mask(positions, segments, valid, cfg.image_height, cfg.image_width,
                           cfg.block_height, cfg.block_width, cfg.flange_height, cfg.flange_width)


@pytest.mark.parametrize('cfg,n', CASES)
def test_layer_matches_dense_reference(cfg, n):
  module = image_local.ImageLocalAttention(
      config=cfg, shared=shared_settings(num_heads=H, head_dim=HD, d_model=D))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = module.init(jax.random.PRNGKey(0), x, {}, ctx)['params']
  y, state, aux = jax.jit(module.apply)({'params': params}, x, {}, ctx)
  assert state == {} and aux == {}
  allowed = reference_mask(cfg, positions, segments, valid)
  assert allowed.sum() < allowed.size // 2        # the pattern is local, not everything
  expected = reference_layer(nn.meta.unbox(params), x, positions, allowed)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('cfg,n', [CASES[1], CASES[3]])
def test_gradients_match_dense_reference(cfg, n):
  positions, segments, valid = chunk_facts(n)
  allowed = reference_mask(cfg, positions, segments, valid)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))
  slots, query_len = image_local.key_slots(n, cfg)

  def fast_loss(q, k, v):
    out = image_local.gathered_local_attention(q, k, v, jnp.asarray(positions),
                                               jnp.asarray(segments), jnp.asarray(valid),
                                               slots, query_len)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent)
  assert_gradients_match(fast_loss, dense_loss, (q, k, v))


def test_fully_masked_queries_give_zeros():
  """A padded query that sees no key (its only keys are padding) outputs 0, not NaN."""
  n = 8
  positions, segments, valid = chunk_facts(n, boundary=4, padding=4)
  q = jnp.ones((B, n, H, HD))
  slots, query_len = image_local.key_slots(n, section(query_len=4, memory_len=0))
  out = image_local.gathered_local_attention(q, q, q, jnp.asarray(positions),
                                             jnp.asarray(segments), jnp.asarray(valid),
                                             slots, query_len)
  assert np.isfinite(np.asarray(out)).all()
  np.testing.assert_array_equal(np.asarray(out)[1, 4:], 0.0)


def test_block_raster_order_round_trips_and_walks_blocks():
  image = np.arange(4 * 6).reshape(4, 6)
  stream = image_local.to_block_raster(image, 2, 3)
  walked = [image[r, c] for r, c in block_raster_coordinates(4, 6, 2, 3)]
  np.testing.assert_array_equal(stream, walked)
  np.testing.assert_array_equal(image_local.from_block_raster(stream, 4, 6, 2, 3), image)
  batch = np.stack([image, image + 100])
  np.testing.assert_array_equal(
      image_local.from_block_raster(image_local.to_block_raster(batch, 2, 3), 4, 6, 2, 3), batch)


# n = 1024 (a 32 x 32 image in 2D); the memory block of every case is far below n.
NO_N_BY_N_CASES = [
    pytest.param(section(query_len=32, memory_len=32), True, id='1d-causal'),
    pytest.param(section(query_len=32, memory_len=32), False, id='1d-bidirectional'),
    pytest.param(section(layout='2d', image_height=32, image_width=32, block_height=8,
                         block_width=8, flange_height=4, flange_width=4), True, id='2d-causal'),
    pytest.param(section(layout='2d', image_height=32, image_width=32, block_height=8,
                         block_width=8, flange_height=4, flange_width=4), False,
                 id='2d-bidirectional'),
]


@pytest.mark.parametrize('cfg,causal', NO_N_BY_N_CASES)
def test_forward_and_backward_never_build_an_n_by_n_array(cfg, causal):
  """The jaxpr of forward + backward (sub-programs included) holds no array larger than
  n x (keys of a memory block): the logits of the gathered blocks."""
  from tests.support.intermediate_sizes import largest_intermediate
  n = 1024
  slots, query_len = image_local.key_slots(n, cfg, causal)
  order = image_local.bidirectional_query_order(n, cfg, causal)
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  q = jnp.ones((1, n, 1, 8))

  def loss(q, k, v):
    return jnp.sum(image_local.gathered_local_attention(
        q, k, v, positions, jnp.zeros_like(positions), jnp.ones((1, n), bool), slots, query_len,
        causal=causal, query_order=order))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
  assert largest <= n * slots.shape[1] < n * n // 3, largest


@pytest.mark.parametrize('values,chunk,key,match', [
    ({'layout': '3d'}, 64, 'model.image_local.layout', 'must be one of'),
    ({'query_len': 0}, 64, 'model.image_local.query_len', 'must be >= 1'),
    ({'memory_len': -1}, 64, 'model.image_local.memory_len', 'must be >= 0'),
    ({'layout': '2d', 'block_width': 3}, 64, 'model.image_local.block_width',
     'must divide image_width=8'),
    ({'layout': '2d'}, 96, 'model.image_local.image_height', 'whole images of 8 x 8 = 64'),
])
def test_bad_settings_name_their_key(values, chunk, key, match):
  with pytest.raises(ConfigError, match=match) as error:
    resolve_model({'attention': 'image_local', 'image_local': values}, chunk_lens=(chunk,))
  assert error.value.key == key


def test_benchmark_cases_agree_and_count_pairs():
  from benchmarks import image_local_cases
  n = 640
  cases = {case.variant: case for case in image_local_cases.CASES}
  inputs = cases['image_local_1d_blocked'].make_inputs(n, jax.random.PRNGKey(0))
  fast = jax.jit(cases['image_local_1d_blocked'].forward)(*inputs)
  dense = jax.jit(cases['image_local_1d_dense_mask'].forward)(*inputs)
  np.testing.assert_allclose(np.asarray(fast), np.asarray(dense), rtol=1e-4, atol=1e-5)
  assert image_local_cases.local_1d_pairs(n) == int(image_local_cases.local_1d_allowed(n).sum())

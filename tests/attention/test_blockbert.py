"""BlockBERT blockwise attention against a float64 dense-mask reference.

The reference writes the paper's blockwise mask (Qiu et al., 2020:
M[i, j] = 1 iff pi(blk(i)) = blk(j)) pair by pair with Python loops from the
listed permutations, with blocks of ceil(n / b) tokens; in a causal model it
adds the causal rule j <= i to that same mask (so a shift's wrap-around block,
entirely in the future, is masked: the fast path's causal form i -> i - s
must agree). Same document and real keys on top; plain softmax in numpy
float64. Inputs have a document boundary and padding, and lengths that are
and are not multiples of the number of blocks.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from benchmarks import blockbert_cases
from longformer_jax.attention.blockbert import (BlockBERTAttention, BlockBERTConfig,
                                                blockbert_attention, key_block_maps)
from longformer_jax.attention.registry import attention_layer
from longformer_jax.config.errors import ConfigError
from tests.support.dense_mask_reference import chunk_facts as sparse_chunk_facts
from tests.support.dense_mask_reference import context_for, dense_jax_attention, reference_layer
from tests.support.fast_compile import FAST_COMPILE
from tests.support.gradient_checks import assert_gradients_match
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config

B, D, H, HD = 2, 32, 4, 8
START = 40     # stream position of the chunk's first token


def reference_mask(permutations: str, causal: bool, positions, segments, valid,
                   num_heads=H) -> np.ndarray:
  """`[batch, heads, n, n]` bool, one (query, key) pair at a time, from the paper's rule."""
  maps = [[int(e) for e in part.split(',')] for part in permutations.split(';')]
  b, n = positions.shape
  block = -(-n // len(maps[0]))
  allowed = np.zeros((b, num_heads, n, n), bool)
  for row in range(b):
    rel = positions[row] - positions[row, 0]
    for h in range(num_heads):
      pi = maps[h * len(maps) // num_heads]
      for i in range(n):
        for j in range(n):
          allowed[row, h, i, j] = (valid[row, j] and segments[row, i] == segments[row, j]
                                   and pi[rel[i] // block] == rel[j] // block
                                   and (not causal or rel[j] <= rel[i]))
  return allowed


# Row 1 starts a new document at slot 5 (the sparse tests' rows, B = 2, START = 40).
chunk_facts = functools.partial(sparse_chunk_facts, boundary=5)


# (permutations, causal, n): b = 2 and 3, n a multiple of b and not; bidirectional
# permutations that are not shifts; the causal forms of shifts.
CASES = [('0,1;1,0', False, 16), ('0,1;1,0', False, 15), ('0,2,1;1,0,2', False, 17),
         ('0,1;1,0', True, 16), ('0,1,2;2,0,1', True, 13), ('1,2,0;0,1,2', True, 18)]


@pytest.mark.parametrize('permutations,causal,n', CASES)
def test_layer_matches_dense_reference(permutations, causal, n):
  module = BlockBERTAttention(config=BlockBERTConfig(permutations=permutations),
                              shared=shared_settings(num_heads=H, head_dim=HD, d_model=D,
                                                     causal=causal))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = jax.jit(module.init, compiler_options=FAST_COMPILE)(jax.random.PRNGKey(0), x, {},
                                                               ctx)['params']
  y, state, aux = jax.jit(module.apply, compiler_options=FAST_COMPILE)({'params': params}, x, {},
                                                                       ctx)
  assert state == {} and aux == {}
  allowed = reference_mask(permutations, causal, positions, segments, valid)
  expected = reference_layer(params, x, positions, allowed)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('permutations,causal,n', [('0,2,1;1,0,2', False, 17),
                                                   ('0,1,2;2,0,1', True, 13)])
def test_gradients_match_dense_reference(permutations, causal, n):
  positions, segments, valid = chunk_facts(n)
  allowed = reference_mask(permutations, causal, positions, segments, valid)
  key_blocks = key_block_maps(permutations, H, causal)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))

  def blocked_loss(q, k, v):
    out = blockbert_attention(q, k, v, jnp.asarray(positions), jnp.asarray(segments),
                              jnp.asarray(valid), key_blocks, causal=causal)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent)
  assert_gradients_match(blocked_loss, dense_loss, (q, k, v))


def test_causal_shift_heads_give_zeros_in_the_first_blocks():
  """Shift s: query blocks 0..s-1 have no key block (their wrap-around is the future)."""
  n, b = 12, 3
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  q = k = v = jax.random.normal(jax.random.PRNGKey(0), (1, n, 2, HD))
  key_blocks = key_block_maps('0,1,2;1,2,0', 2, causal=True)         # identity, shift 2
  np.testing.assert_array_equal(key_blocks, [[0, 1, 2], [-1, -1, 0]])
  out = np.asarray(blockbert_attention(q, k, v, positions, jnp.zeros_like(positions),
                                       jnp.ones((1, n), bool), key_blocks, causal=True))
  np.testing.assert_array_equal(out[0, :2 * n // b, 1], 0.0)
  assert np.abs(out[0, 2 * n // b:, 1]).min() > 0 and np.abs(out[0, :, 0]).min() > 0


def test_forward_and_backward_never_build_an_n_by_n_array():
  n, b = 1024, 4
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  q = jnp.ones((1, n, 2, 8))
  key_blocks = key_block_maps('0,1,2,3;3,0,1,2', 2, causal=False)

  def loss(q, k, v):
    return jnp.sum(blockbert_attention(q, k, v, positions, jnp.zeros_like(positions),
                                       jnp.ones((1, n), bool), key_blocks, causal=False))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
  # Scores of 2 heads, each [b, n / b, n / b]: 2 n^2 / b elements.
  assert largest <= 2 * n * n // b < n * n, largest


def test_benchmark_fast_case_equals_dense_mask_case():
  cases = {case.variant: case for case in blockbert_cases.CASES}
  inputs = cases['blockbert_blocked'].make_inputs(1100, jax.random.PRNGKey(3))   # 3 blocks
  fast = jax.jit(cases['blockbert_blocked'].forward)(*inputs)
  dense = jax.jit(cases['blockbert_dense_mask'].forward)(*inputs)
  np.testing.assert_allclose(np.asarray(fast), np.asarray(dense), atol=2e-5)
  assert cases['blockbert_blocked'].flops(1024) == 4 * 64 * 8 * 1024 * 512


@pytest.mark.parametrize('key,section,shared', [
    ('model.blockbert.permutations', dict(permutations='0,x'), {}),
    ('model.blockbert.permutations', dict(permutations=''), {}),
    ('model.blockbert.permutations', dict(permutations='0,1;0,1,2'), {}),
    ('model.blockbert.permutations', dict(permutations='0,0'), {}),
    ('model.blockbert.permutations', dict(permutations='0,2'), {}),
    ('model.blockbert.permutations', dict(permutations='0,1;1,0;0,1'), {}),      # 2 heads
    ('model.blockbert.permutations', dict(permutations='0,2,1'), {}),            # causal
    ('model.blockbert.block', dict(block=4), {}),                               # unknown
])
def test_bad_settings_name_their_key(key, section, shared):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='blockbert', blockbert=section, **shared)
  assert error.value.key == key
  if 'permutations' in section:
    assert repr(section['permutations']) in str(error.value)


def test_bidirectional_allows_any_permutation_and_config_is_read():
  cfg = tiny_model_config(attention='blockbert', causal=False,
                          blockbert=dict(permutations='0,2,1;2,1,0'))
  module = attention_layer(cfg, jnp.float32)
  assert (module.config.permutations, module.shared.causal) == ('0,2,1;2,1,0', False)
  # The same layer made causal after the check: building its key-block maps refuses it.
  cfg = dataclasses.replace(cfg, causal=True)
  module = attention_layer(cfg, jnp.float32)
  ctx = context_for(*chunk_facts(6))
  with pytest.raises(ConfigError) as error:
    module.init(jax.random.PRNGKey(0), jnp.zeros((B, 6, cfg.d_model)), {}, ctx)
  assert error.value.key == 'model.blockbert.permutations'


@pytest.mark.slow
def test_trains_as_a_language_model(tmp_path):
  config = tiny_config(attention='blockbert', blockbert=dict(permutations='0,1;1,0'))
  config.data.chunk_len = 16
  config.train.update(num_steps=3, log_every=1, checkpoint_every=3)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 3 and np.isfinite(metrics['loss'])
  assert state.memory == ({}, {})

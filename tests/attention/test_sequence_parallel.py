"""Sequence parallelism: attention split along the chunk over the `sequence` mesh axis.

Outputs and gradients (w.r.t. q, k, v) of all-gather and ring attention,
causal and bidirectional, with and without the zigzag load balancing, on
meshes data 2 x sequence 4 and sequence 8, equal the dense masked softmax
on one device (`dot_product.attend` with `masking.causal_document_mask`),
on rows with padding and documents that start inside the chunk; the sliding-window
version (halo exchange) equals the dense softmax under the window mask.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.core.dot_product import attend
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.core.sliding_window import window_allowed
from longformer_jax.config.errors import ConfigError
from longformer_jax.attention.sequence_parallel import load_balance
from longformer_jax.parallel.mesh import MESH_AXES, make_mesh, mesh_axis_sizes
from longformer_jax.parallel.parallel_config import (ParallelConfig, check_sequence_split,
                                                     length_on_sequence)
from longformer_jax.attention.sequence_parallel.attention import sequence_parallel_attention
from longformer_jax.attention.sequence_parallel.window_attention import (
    sequence_parallel_window_attention)

BATCH, CHUNK, HEADS, HEAD_DIM = 4, 32, 2, 8
DATA_2_SEQUENCE_4 = (2, 1, 1, 4)
SEQUENCE_8 = (1, 1, 1, 8)


@pytest.fixture(scope='module')
def inputs():
  """q, k, v, cotangent `[4, 32, 2, 8]` and `[4, 32]` positions, documents, valid bits.

  Row 0: one document; row 1: padding at its start, a document from token 5;
  row 2: documents from tokens 13 and 20, padding at the end; row 3: a
  document starting at the last token. Positions continue a stream (start 100+).
  """
  rng = np.random.RandomState(0)
  q, k, v, cotangent = (jnp.asarray(rng.randn(BATCH, CHUNK, HEADS, HEAD_DIM), jnp.float32)
                        for _ in range(4))
  positions = 100 + 37 * np.arange(BATCH)[:, None] + np.arange(CHUNK)[None]
  token = np.arange(CHUNK)[None]
  starts = [[99], [5, 99], [13, 20], [31, 99]]
  segments = np.stack([sum((token[0] >= s).astype(np.int32) for s in row) for row in starts])
  valid = np.ones((BATCH, CHUNK), bool)
  valid[1, :3] = False
  valid[2, -5:] = False
  return dict(q=q, k=k, v=v, cotangent=cotangent, positions=jnp.asarray(positions, jnp.int32),
              segment_ids=jnp.asarray(segments, jnp.int32), valid=jnp.asarray(valid))


def reference_attention(q, k, v, positions, segment_ids, valid, causal, window=None):
  """The single-device dense masked softmax (within a one-sided `window` if given)."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(HEAD_DIM)
  mask = causal_document_mask(positions, segment_ids, positions, segment_ids, valid,
                              causal=causal)
  if window is not None:
    mask &= window_allowed(positions[:, :, None], positions[:, None, :], window=window,
                           dilation=1, causal=causal)
  return attend(logits, mask, v)


def outputs_and_grads(attention, inputs):
  """`(out, (dq, dk, dv))` of `attention(q, k, v)` for the cotangent `inputs['cotangent']`."""
  out, pullback = jax.vjp(attention, inputs['q'], inputs['k'], inputs['v'])
  return out, pullback(inputs['cotangent'])


@functools.lru_cache(maxsize=None)
def _jitted_reference(causal, window=None):
  def run(q, k, v, cotangent, positions, segment_ids, valid):
    attention = lambda q, k, v: reference_attention(q, k, v, positions, segment_ids, valid,
                                                    causal, window)
    return outputs_and_grads(attention, dict(q=q, k=k, v=v, cotangent=cotangent))
  return jax.jit(run)


def _sequence_parallel_fn(mesh_shape, method, causal, balanced):
  mesh = make_mesh(mesh_shape, jax.devices()[:8])

  def run(q, k, v, cotangent, positions, segment_ids, valid):
    attention = functools.partial(sequence_parallel_attention, positions=positions,
                                  segment_ids=segment_ids, valid=valid, mesh=mesh, causal=causal,
                                  method=method, load_balance=balanced)
    return outputs_and_grads(attention, dict(q=q, k=k, v=v, cotangent=cotangent))
  return jax.jit(run)


def _args(inputs):
  return tuple(inputs[name] for name in ('q', 'k', 'v', 'cotangent', 'positions', 'segment_ids',
                                         'valid'))


def assert_close(actual, expected, rtol=1e-5):
  """Equal to `rtol` relative to the largest magnitude of `expected`."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  np.testing.assert_allclose(actual, expected, rtol=rtol,
                             atol=rtol * float(np.max(np.abs(expected))))


# Default suite: every method, causal and bidirectional, balanced and not (causal) on
# data 2 x sequence 4, and the balanced causal case on sequence 8; the rest is `slow`.
CASES = [(DATA_2_SEQUENCE_4, method, causal, balanced)
         for method in ('all_gather', 'ring') for causal, balanced in
         ((True, False), (True, True), (False, False))]
CASES += [(SEQUENCE_8, 'all_gather', True, True), (SEQUENCE_8, 'ring', True, True)]
CASES += [pytest.param(*case, marks=pytest.mark.slow) for case in
          [(DATA_2_SEQUENCE_4, method, False, True) for method in ('all_gather', 'ring')] +
          [(SEQUENCE_8, method, True, False) for method in ('all_gather', 'ring')] +
          [(SEQUENCE_8, method, False, False) for method in ('all_gather', 'ring')]]


@pytest.mark.parametrize('mesh_shape,method,causal,balanced', CASES)
def test_matches_dense_reference(inputs, mesh_shape, method, causal, balanced):
  expected_out, expected_grads = _jitted_reference(causal)(*_args(inputs))
  out, grads = _sequence_parallel_fn(mesh_shape, method, causal, balanced)(*_args(inputs))
  assert_close(out, expected_out)
  for name, grad, expected in zip('qkv', grads, expected_grads):
    assert np.max(np.abs(np.asarray(expected))) > 0, name
    assert_close(grad, expected)
  # Row 1's first queries see only padding: zeros, never NaN.
  if causal:
    assert np.all(np.asarray(out)[1, 0] == 0)


@pytest.mark.parametrize('mesh_shape,causal,window', [
    (DATA_2_SEQUENCE_4, True, 5), (DATA_2_SEQUENCE_4, False, 8), (SEQUENCE_8, True, 4)])
def test_sliding_window_matches_dense_reference(inputs, mesh_shape, causal, window):
  """Halo exchange: the window reaches into one neighbour (chunk / n = 8 or 4 tokens)."""
  mesh = make_mesh(mesh_shape, jax.devices()[:8])

  def run(q, k, v, cotangent, positions, segment_ids, valid):
    attention = functools.partial(sequence_parallel_window_attention, positions=positions,
                                  segment_ids=segment_ids, valid=valid, mesh=mesh,
                                  window=window, causal=causal, block_size=4)
    return outputs_and_grads(attention, dict(q=q, k=k, v=v, cotangent=cotangent))
  expected_out, expected_grads = _jitted_reference(causal, window)(*_args(inputs))
  out, grads = jax.jit(run)(*_args(inputs))
  assert_close(out, expected_out)
  for grad, expected in zip(grads, expected_grads):
    assert_close(grad, expected)


def _lowered_text(method, inputs):
  mesh = make_mesh(DATA_2_SEQUENCE_4, jax.devices()[:8])
  if method == 'window':
    attention = functools.partial(sequence_parallel_window_attention, mesh=mesh, window=4)
  else:
    attention = functools.partial(sequence_parallel_attention, mesh=mesh, method=method)
  return jax.jit(attention).lower(inputs['q'], inputs['k'], inputs['v'], inputs['positions'],
                                  inputs['segment_ids'], inputs['valid']).as_text()


def test_ring_passes_blocks_with_collective_permute(inputs):
  text = _lowered_text('ring', inputs)
  assert 'collective_permute' in text and 'all_gather' not in text
  assert 'stablehlo.case' in text or 'stablehlo.if' in text   # hidden blocks are skipped


def test_sliding_window_exchanges_only_halos(inputs):
  text = _lowered_text('window', inputs)
  assert 'collective_permute' in text and 'all_gather' not in text


def test_all_gather_gathers_keys(inputs):
  text = _lowered_text('all_gather', inputs)
  assert 'all_gather' in text and 'collective_permute' not in text


# ---- the zigzag layout --------------------------------------------------------------------


def test_zigzag_gives_device_i_slices_i_and_mirror():
  order = load_balance.zigzag_order(16, 4).reshape(4, 4)   # 4 devices x 4 tokens, slices of 2
  for device in range(4):
    expected = [2 * device, 2 * device + 1, 2 * (7 - device), 2 * (7 - device) + 1]
    assert order[device].tolist() == expected
  x = jnp.arange(2 * 16 * 3).reshape(2, 16, 3)
  np.testing.assert_array_equal(
      load_balance.from_zigzag(load_balance.to_zigzag(x, 4), 4), x)


@pytest.mark.parametrize('devices', [2, 4, 8])
def test_zigzag_balances_causal_work(devices):
  """Unmasked (query, key) pairs per device: equal in the zigzag, unequal when contiguous."""
  length = 64
  causal_pairs = lambda tokens: int(np.sum(tokens + 1))    # query t sees keys 0..t

  def per_device(order):
    return [causal_pairs(block) for block in np.split(order, devices)]
  assert len(set(per_device(load_balance.zigzag_order(length, devices)))) == 1
  assert len(set(per_device(np.arange(length)))) == devices


# ---- the mesh and the config --------------------------------------------------------------


def test_mesh_has_a_sequence_axis_of_size_one_by_default():
  assert mesh_axis_sizes((-1, 1, 1), 8) == dict(data=8, fsdp=1, tensor=1, sequence=1)
  assert mesh_axis_sizes((2, 1, 1, -1), 8) == dict(data=2, fsdp=1, tensor=1, sequence=4)
  mesh = make_mesh((2, 1, 1, 4))
  assert mesh.axis_names == MESH_AXES and dict(mesh.shape)['sequence'] == 4
  assert dict(make_mesh((-1, 1, 1)).shape) == dict(data=8, fsdp=1, tensor=1, sequence=1)


@pytest.mark.parametrize('shape', [(2, 1, 1, 3), (1, 1, 1, 1, 8), (2, -1, 1, -1)])
def test_bad_sequence_mesh_names_the_key(shape):
  with pytest.raises(ConfigError, match='parallel.mesh_shape'):
    mesh_axis_sizes(shape, 8)


def test_sequence_settings_are_checked():
  build = lambda values: ParallelConfig.build(values, 'parallel')
  parallel = build({'mesh_shape': '(2, 1, 1, 4)', 'sequence_parallel': 'all_gather',
                    'load_balance': 'false'})
  assert parallel.mesh_shape == (2, 1, 1, 4) and parallel.load_balance is False
  with pytest.raises(ConfigError, match='^config.parallel.sequence_parallel: .*all_gather'):
    build({'sequence_parallel': 'tree'})
  with pytest.raises(ConfigError, match='^config.parallel.mesh_shape: .*3 or 4'):
    build({'mesh_shape': (1, 1)})
  rules = length_on_sequence(ParallelConfig().logical_axis_rules)
  assert ('length', 'sequence') in rules and ('batch', ('data', 'fsdp')) in rules
  assert ('length', None) in ParallelConfig().logical_axis_rules     # the default is unchanged
  build({'logical_axis_rules': rules})


def test_chunk_must_split_over_the_sequence_axis():
  check_sequence_split((64, 128), 4, load_balance=True)
  check_sequence_split((36,), 4, load_balance=False)
  with pytest.raises(ConfigError, match='^config.parallel.mesh_shape: .*cannot split chunks of 36'):
    check_sequence_split((64, 36), 8, load_balance=False)
  with pytest.raises(ConfigError, match='^config.parallel.load_balance: .*divisible by 2 x'):
    check_sequence_split((36,), 4, load_balance=True)

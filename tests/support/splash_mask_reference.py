"""Splash kernels against the dense masked softmax: the masks' rules on numpy arrays of
relative positions, the inputs (documents and padding inside the chunk) and the comparison of
outputs and gradients."""

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core.dot_product import attend

B, HD = 2, 16
START = 1000
STRIDE, SUMMARY = 16, 3
RTOL, ATOL = 1e-5, 1e-5         # atol: float32 rounding of values that are exactly 0


def rule_np(name: str, i: np.ndarray, j: np.ndarray, stride: int = STRIDE,
            summary: int = SUMMARY, query_len: int = 0, memory_len: int = 0) -> np.ndarray:
  """The same rules on broadcasting numpy arrays of relative positions."""
  d = i - j
  if name == 'strided_local':
    return (d >= 0) & (d < stride)
  if name == 'strided_summary':
    return (d >= 0) & (np.mod(d, stride) == 0)
  if name == 'fixed_local':
    return (d >= 0) & (np.floor_divide(i, stride) == np.floor_divide(j, stride))
  if name == 'fixed_summary':
    return (d >= 0) & (np.mod(j, stride) >= stride - summary)
  if name in ('strided', 'fixed'):
    return (rule_np(f'{name}_local', i, j, stride, summary)
            | rule_np(f'{name}_summary', i, j, stride, summary))
  if name == 'image_1d':
    return (d >= 0) & (j >= np.floor_divide(i, query_len) * query_len - memory_len)
  if name == 'image_1d_bidirectional':
    block_start = np.floor_divide(i, query_len) * query_len
    return (j >= block_start - memory_len) & (j < block_start + query_len + memory_len)
  if name.startswith('window'):
    left, right = (int(x) for x in name.split('_')[1:])
    return (-d >= -left) & (-d <= right)
  raise ValueError(name)


def chunk_facts(chunk: int):
  """`(positions, segments, valid)` numpy `[B, chunk]` (see the module docstring)."""
  positions = np.tile(np.arange(START, START + chunk, dtype=np.int32), (B, 1))
  segments = np.zeros((B, chunk), np.int32) + 7
  segments[1] = 2 + (np.arange(chunk) >= chunk // 3) + (np.arange(chunk) >= 2 * chunk // 3)
  valid = np.ones((B, chunk), bool)
  valid[0, 3 * chunk // 4:] = False
  segments[0, 3 * chunk // 4:] = 8
  valid[1, chunk // 3:chunk // 3 + 3] = False
  return positions, segments, valid


def reference_mask(head_rules, chunk: int, **rule_args) -> np.ndarray:
  """`[B, heads, q, k]` bool: each head's rule on relative positions, documents, padding."""
  positions, segments, valid = chunk_facts(chunk)
  rel = positions - positions[:, :1]
  docs = (segments[:, :, None] == segments[:, None, :]) & valid[:, None, :]
  return np.stack([rule_np(name, rel[:, :, None], rel[:, None, :], **rule_args) & docs
                   for name in head_rules], axis=1)


def random_qkv(chunk: int, heads: int, seed: int = 0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v, probe = (jax.random.normal(key, (B, chunk, heads, HD), jnp.float32) for key in keys)
  return q * HD ** -0.5, k, v, probe


def compare(kernel_fn, head_rules, chunk: int, **rule_args):
  """Splash `kernel_fn(q, k, v, segments, valid)` vs the dense reference: outputs, dq, dk, dv."""
  compare_with_mask(kernel_fn, reference_mask(head_rules, chunk, **rule_args), chunk)


def compare_with_mask(kernel_fn, mask: np.ndarray, chunk: int):
  """Splash `kernel_fn` vs the dense masked softmax under `mask [B, heads, q, k]`."""
  heads = mask.shape[1]
  _, segments, valid = chunk_facts(chunk)
  q, k, v, probe = random_qkv(chunk, heads)

  @jax.jit
  def run(q, k, v):
    kernel = lambda q, k, v: kernel_fn(q, k, v, jnp.asarray(segments), jnp.asarray(valid))
    dense = lambda q, k, v: attend(jnp.einsum('bqhd,bkhd->bhqk', q, k), jnp.asarray(mask), v)
    results = []
    for fn in (kernel, dense):
      out, pullback = jax.vjp(fn, q, k, v)
      results.append((out, pullback(probe)))
    return results

  (out, grads), (want, want_grads) = run(q, k, v)
  np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
  for got, expected, what in zip(grads, want_grads, 'qkv'):
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=f'd{what}')
  empty = ~mask.any(-1)                                  # [B, heads, q]
  assert empty.any(), 'the inputs must contain queries with no allowed key'
  np.testing.assert_array_equal(np.asarray(out).transpose(0, 2, 1, 3)[empty], 0.0)

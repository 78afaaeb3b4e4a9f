"""Random feature maps of the Performer (Choromanski et al., 2021, FAVOR+).

A kernel K(x, y) is estimated by phi(x) . phi(y) with m random features.

- Softmax kernel, positive features (the paper's Lemma 1, eq. for SM+):
    exp(x . y) = E_w[exp(w . x - |x|^2 / 2) exp(w . y - |y|^2 / 2)],  w ~ N(0, I_d),
  so phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) is an unbiased estimate with
  positive entries. Attention uses x = q / d^(1/4) and y = k / d^(1/4), so
  that x . y = q . k / sqrt(d) (`softmax_logits` folds the scaling in).
- ReLU kernel (generalised attention, sec. 2.2): phi(x) = relu(W x) / sqrt(m)
  + eps, as the authors' code (the small eps keeps the normaliser positive).

W `[m, d]` holds orthogonal random features (sec. 2.4, ORF): blocks of d
Gaussian rows orthogonalised (the Q of their QR decomposition, by Gram-Schmidt:
each block is a Haar-random rotation), each row then rescaled to the norm of an independent Gaussian
vector (`norm='chi'`: the rows' marginals stay N(0, I_d), the estimate stays
unbiased) or to sqrt(d) (`norm='sqrt_d'`, lower variance, slightly biased).
Rows of different blocks are independent.
"""

import math

import jax
import jax.numpy as jnp

FEATURE_NORMS = ('chi', 'sqrt_d')


def orthonormal_rows(gaussian: jax.Array) -> jax.Array:
  """Gram-Schmidt over the rows of `[blocks, d, d]` (each projection done twice, CGS2).

  Plain array ops rather than `jnp.linalg.qr`: the LAPACK custom call, run by
  several layers at once inside a jitted train step, left XLA's CPU thread
  pool waiting forever (seen with configs/performer.py on 2 cores).
  """
  dim = gaussian.shape[-1]

  def body(i, rows):
    row = rows[:, i]                                               # [blocks, d]
    basis = jnp.where((jnp.arange(dim) < i)[None, :, None], rows, 0.0)
    for _ in range(2):
      row = row - jnp.einsum('bj,bjd->bd', jnp.einsum('bjd,bd->bj', basis, row), basis)
    return rows.at[:, i].set(row * jax.lax.rsqrt(jnp.sum(jnp.square(row), -1, keepdims=True)))
  return jax.lax.fori_loop(0, dim, body, gaussian)


def random_feature_matrix(key: jax.Array, num_features: int, dim: int, norm: str = 'chi',
                          orthogonal: bool = True) -> jax.Array:
  """Random projections W `[num_features, dim]` float32 (module docstring).

  `orthogonal=False` gives i.i.d. Gaussian rows (unstructured features); with
  `norm='sqrt_d'` they are rescaled to length sqrt(dim) too.
  """
  if norm not in FEATURE_NORMS:
    raise ValueError(f'feature norm {norm!r} is not one of {FEATURE_NORMS}')
  num_blocks = -(-num_features // dim)
  block_key, norm_key = jax.random.split(key)
  gaussian = jax.random.normal(block_key, (num_blocks, dim, dim), jnp.float32)
  if orthogonal:
    directions = orthonormal_rows(gaussian).reshape(num_blocks * dim, dim)[:num_features]
    if norm == 'chi':
      lengths = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, dim)), axis=-1)
    else:
      lengths = jnp.full((num_features,), math.sqrt(dim), jnp.float32)
    return directions * lengths[:, None]
  rows = gaussian.reshape(num_blocks * dim, dim)[:num_features]
  if norm == 'sqrt_d':
    rows = rows * (math.sqrt(dim) / jnp.linalg.norm(rows, axis=-1, keepdims=True))
  return rows


def softmax_logits(x: jax.Array, features: jax.Array) -> jax.Array:
  """log(sqrt(m) phi(x)) = W x' - |x'|^2 / 2 with x' = x / d^(1/4).

  Args:
    x: `[..., d]` queries or keys (not yet scaled).
    features: W `[m, d]`.
  Returns:
    `[..., m]` float32.
  """
  x = x.astype(jnp.float32) * (x.shape[-1] ** -0.25)
  projected = jnp.einsum('...d,md->...m', x, features)
  return projected - 0.5 * jnp.sum(jnp.square(x), axis=-1, keepdims=True)


def positive_softmax_features(x: jax.Array, features: jax.Array) -> jax.Array:
  """phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), unshifted: E[phi(q) . phi(k)] = exp(q.k / sqrt(d)).

  `[..., d]` -> `[..., m]` float32. The attention itself uses shifted
  versions (attention/performer/attention.py) whose shifts cancel in the normalised output.
  """
  return jnp.exp(softmax_logits(x, features)) / math.sqrt(features.shape[0])


def relu_features(x: jax.Array, features: jax.Array, eps: float) -> jax.Array:
  """phi(x) = relu(W x) / sqrt(m) + eps: `[..., d]` -> `[..., m]` float32."""
  projected = jnp.einsum('...d,md->...m', x.astype(jnp.float32), features)
  return jax.nn.relu(projected) / math.sqrt(features.shape[0]) + eps


def segmented_cummax(x: jax.Array, segments: jax.Array, reverse: bool = False) -> jax.Array:
  """Running max of x `[b, L, ...]` along axis 1, restarting where `segments [b, L]` changes.

  Segments must be contiguous along the row (non-decreasing, or non-increasing):
  an element (s, v) is the max v over the trailing run of segment s, and the
  combination is then associative. `reverse`: the max over the later
  positions of the same segment.
  """
  segments = segments.reshape(segments.shape + (1,) * (x.ndim - 2))

  def combine(left, right):
    (left_seg, left_max), (right_seg, right_max) = left, right
    return right_seg, jnp.where(left_seg == right_seg, jnp.maximum(left_max, right_max),
                                right_max)
  return jax.lax.associative_scan(combine, (segments, x), reverse=reverse, axis=1)[1]


def segment_max(x: jax.Array, segments: jax.Array) -> jax.Array:
  """Max of x `[b, L, ...]` over each contiguous segment, at every position: `[b, L, ...]`."""
  return segmented_cummax(segmented_cummax(x, segments), segments, reverse=True)

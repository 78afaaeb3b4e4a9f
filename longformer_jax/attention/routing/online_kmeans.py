"""Online spherical k-means of the Routing Transformer (Roy et al., 2021, sec. 4.1).

Routing vectors and centroids live on the unit sphere: a vector is assigned
to the centroid with the largest dot product (the nearest one on the sphere).
Centroids are not trained by gradient; after each training chunk every
centroid moves towards the mean of the vectors assigned to it by an
exponential moving average and is projected back onto the sphere:

  mu <- unit(lambda * mu + (1 - lambda) * mean{x : x assigned to mu})

(the paper's update, with the cluster's sum of queries and keys taken as a
mean so that the step does not grow with the batch; a centroid no vector
chose keeps its place). The commitment loss |x - SG(mu(x))|^2 pulls the
routing vectors towards their centroids through the gradient instead.

Shapes: routing vectors `[batch, n, heads, head_dim]`, centroids
`[heads, clusters, head_dim]` (one set of centroids per head).
"""

import jax
import jax.numpy as jnp

EPS = 1e-6


def unit(x: jax.Array) -> jax.Array:
  """`x / |x|` over the last axis, float32 (a zero vector stays finite)."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + EPS)


def nearest_centroid(vectors: jax.Array, centroids: jax.Array) -> jax.Array:
  """`[batch, n, heads, d]` unit vectors -> `[batch, n, heads]` int32 cluster ids."""
  scores = jnp.einsum('bnhd,hcd->bnhc', vectors, centroids.astype(jnp.float32))
  return jnp.argmax(scores, axis=-1).astype(jnp.int32)


def assigned_means(vectors: jax.Array, clusters: jax.Array, valid: jax.Array,
                   num_clusters: int) -> tuple[jax.Array, jax.Array]:
  """Mean of the valid vectors assigned to each cluster, and their count.

  Args:
    vectors: `[batch, n, heads, d]` float32; clusters: `[batch, n, heads]`;
    valid: `[batch, n]` bool.
  Returns:
    `(means [heads, clusters, d], counts [heads, clusters])`; empty clusters
    have mean 0 and count 0.
  """
  one_hot = jax.nn.one_hot(clusters, num_clusters, dtype=jnp.float32)
  one_hot = one_hot * valid[:, :, None, None].astype(jnp.float32)
  sums = jnp.einsum('bnhc,bnhd->hcd', one_hot, vectors)
  counts = jnp.sum(one_hot, axis=(0, 1))
  return sums / jnp.maximum(counts, 1.0)[..., None], counts


def ema_update(centroids: jax.Array, vectors: jax.Array, clusters: jax.Array, valid: jax.Array,
               decay: float) -> jax.Array:
  """The new centroids `[heads, clusters, d]` (module docstring), float32, no gradient."""
  centroids = centroids.astype(jnp.float32)
  means, counts = assigned_means(jax.lax.stop_gradient(vectors), clusters, valid,
                                 centroids.shape[1])
  moved = unit(decay * centroids + (1.0 - decay) * means)
  return jnp.where((counts > 0)[..., None], moved, centroids)


def commitment_loss(vectors: jax.Array, centroids: jax.Array, clusters: jax.Array,
                    valid: jax.Array) -> jax.Array:
  """Mean over valid tokens and heads of |x - SG(mu(x))|^2: a float32 scalar."""
  chosen = jnp.take_along_axis(
      jax.lax.stop_gradient(centroids.astype(jnp.float32))[None, None],   # [1, 1, h, c, d]
      clusters[..., None, None], axis=3)[..., 0, :]                       # [b, n, h, d]
  distance = jnp.sum(jnp.square(vectors - chosen), axis=-1)              # [b, n, h]
  weight = valid[:, :, None].astype(jnp.float32)
  return jnp.sum(distance * weight) / jnp.maximum(jnp.sum(weight) * vectors.shape[2], 1.0)

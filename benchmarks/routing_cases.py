"""Attention-scaling cases for the Routing Transformer (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, no
padding, causal; every head a routing head (shared query-key z). As in the
paper, k = sqrt(n) centroids per head (fixed random unit vectors) and a
window of n / k = sqrt(n) keys of the query's cluster, so the work grows as
n^1.5. Both cases include the routing itself (unit(z), nearest centroid).

- `routing_blocked`: the library's path (`routing_attention`): a sort by
  (cluster, position), then blocks of `window` sorted slots attending to
  their own and the previous block.
- `routing_dense_mask`: the same rule as an n x n mask (same cluster, earlier,
  at most `window` cluster tokens back, the query itself only when alone)
  and dense masked attention (skipped above 4k).

`flops(n)`: 4 * head_dim FLOPs per (query, key) pair the window allows,
n * window per head, plus the centroid scores (2 * n * k * head_dim per head).

Quick check: python -m benchmarks.routing_cases --seq_len=1024
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase, quick_check
from benchmarks.sparse_cases import HEAD_DIM, HEADS, one_document
from longformer_jax.attention.routing import attention as routing
from longformer_jax.attention.routing import online_kmeans
from longformer_jax.attention.core.dot_product import attend

DENSE_MAX_LEN = 4096


def shape(n: int) -> tuple[int, int]:
  """(clusters k, window n / k) with k = round(sqrt(n))."""
  k = max(1, round(math.sqrt(n)))
  return k, -(-n // k)


@functools.lru_cache(maxsize=None)
def centroids(k: int) -> np.ndarray:
  with jax.ensure_compile_time_eval():
    return np.asarray(online_kmeans.unit(
        jax.random.normal(jax.random.PRNGKey(7), (HEADS, k, HEAD_DIM))))


def make_inputs(n: int, key: jax.Array) -> tuple:
  """z (shared query-key) and v: `[1, n, 8, 64]` float32."""
  return tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in jax.random.split(key, 2))


def clusters_of(z: jax.Array) -> jax.Array:
  k, _ = shape(z.shape[1])
  route = jax.lax.stop_gradient(online_kmeans.unit(z))
  return online_kmeans.nearest_centroid(route, jnp.asarray(centroids(k)))


def routing_blocked(z, v):
  _, window = shape(z.shape[1])
  return routing.routing_attention(z / math.sqrt(HEAD_DIM), z, v, clusters_of(z),
                                   *one_document(z.shape[1]), window=window, causal=True)


def routing_dense_mask(z, v):
  """The rule on every pair: `[1, heads, n, n]` mask from each token's rank in its cluster."""
  n = z.shape[1]
  _, window = shape(n)
  clusters = jnp.swapaxes(clusters_of(z), 1, 2)                             # [1, h, n]
  rank = jnp.cumsum(jax.nn.one_hot(clusters, shape(n)[0], dtype=jnp.int32), axis=2)
  rank = jnp.take_along_axis(rank, clusters[..., None], axis=-1)[..., 0]    # [1, h, n]
  earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
  mask = ((clusters[..., :, None] == clusters[..., None, :]) & earlier
          & (rank[..., :, None] - rank[..., None, :] <= window))
  mask |= ~jnp.any(mask, axis=-1, keepdims=True) & jnp.eye(n, dtype=bool)
  logits = jnp.einsum('bqhd,bkhd->bhqk', z / math.sqrt(HEAD_DIM), z)
  return attend(logits, mask, v)


def routing_flops(n: int) -> float:
  k, window = shape(n)
  return HEADS * HEAD_DIM * (4.0 * n * window + 2.0 * n * k)


CASES = [
    AttentionCase('routing_blocked', make_inputs, routing_blocked, routing_flops),
    AttentionCase('routing_dense_mask', make_inputs, routing_dense_mask, routing_flops,
                  max_seq_len=DENSE_MAX_LEN),
]


def main() -> None:
  quick_check(CASES, __doc__.splitlines()[0])


if __name__ == '__main__':
  main()

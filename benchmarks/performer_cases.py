"""Attention-scaling cases for the Performer, FAVOR+ (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, no padding.
Causal softmax-kernel attention with m = 256 positive orthogonal random
features (fixed: `PRNGKey(0)`), blocks of 64 positions.

- `performer_causal_blocked`: the library's fast path, a scan over blocks
  with carried prefix sums S = sum phi(k) v^T, z = sum phi(k): O(n m d).
- `performer_causal_dense_mask`: the same computation as the paper writes it
  before associativity: the n x n matrix phi(Q) phi(K)^T under the causal
  mask, times V, over its row sums: O(n^2 m) (skipped above 4k).

`flops(n)` counts the useful work of the linear form, for both rows: the
feature maps (2 n h d m each for queries and keys) and, per token, the update
and the read of S and z (2 h m (d + 1) each).

Quick check (each case once at one length, blocked vs dense-mask agreement):
  python -m benchmarks.performer_cases --seq_len=1024
"""

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase
from longformer_jax.attention import performer
from longformer_jax.attention.core import random_features

HEADS, HEAD_DIM = 8, 64
NUM_FEATURES, BLOCK_LEN = 256, 64
DENSE_MAX_LEN = 4096


def make_qkv(n: int, key: jax.Array) -> tuple:
  """q, k, v: `[1, n, 8, 64]` float32."""
  return tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in jax.random.split(key, 3))


def one_document(n: int):
  """positions, segment_ids, valid `[1, n]` of one unpadded document."""
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  return positions, jnp.zeros_like(positions), jnp.ones(positions.shape, bool)


@functools.lru_cache(maxsize=None)
def fixed_features() -> np.ndarray:
  with jax.ensure_compile_time_eval():
    return np.asarray(random_features.random_feature_matrix(
        jax.random.PRNGKey(0), NUM_FEATURES, HEAD_DIM))


def performer_blocked(q, k, v):
  empty = performer.empty_state(1, HEADS, NUM_FEATURES, HEAD_DIM)
  out, _ = performer.causal_performer_attention(q, k, v, *one_document(q.shape[1]),
                                                jnp.asarray(fixed_features()), empty,
                                                block_len=BLOCK_LEN)
  return out


def performer_dense_mask(q, k, v):
  """phi(Q) phi(K)^T `[1, h, n, n]` under the causal mask; one key shift per head."""
  w = jnp.asarray(fixed_features())
  n = q.shape[1]
  phi_q = performer.query_features(q, w, 'softmax', performer.RELU_EPS)
  logits = random_features.softmax_logits(k, w)
  phi_k = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=(1, 3), keepdims=True)))
  causal = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]
  scores = jnp.einsum('bqhm,bkhm->bhqk', phi_q, phi_k) * causal
  out = jnp.einsum('bhqk,bkhd->bqhd', scores, v)
  return out / jnp.swapaxes(jnp.sum(scores, axis=-1), 1, 2)[..., None]


def performer_flops(n: int) -> float:
  features = 2 * 2.0 * n * HEADS * HEAD_DIM * NUM_FEATURES
  prefix_sums = 2 * 2.0 * n * HEADS * NUM_FEATURES * (HEAD_DIM + 1)
  return features + prefix_sums


CASES = [
    AttentionCase('performer_causal_blocked', make_qkv, performer_blocked, performer_flops),
    AttentionCase('performer_causal_dense_mask', make_qkv, performer_dense_mask, performer_flops,
                  max_seq_len=DENSE_MAX_LEN),
]


def seconds(fn, *args) -> float:
  """Wall time of one call after a compiling call."""
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--seq_len', type=int, default=1024)
  n = parser.parse_args().seq_len
  outputs = {}
  for case in CASES:
    if n > case.max_seq_len:
      continue
    inputs = case.make_inputs(n, jax.random.PRNGKey(0))
    forward = jax.jit(case.forward)
    fwd_bwd = jax.jit(jax.grad(lambda *a: jnp.sum(case.forward(*a)), argnums=(0, 1, 2)))
    outputs[case.variant] = np.asarray(forward(*inputs))
    print(f'{case.variant:30s} n={n}  fwd {seconds(forward, *inputs):.3f}s  '
          f'fwd_bwd {seconds(fwd_bwd, *inputs):.3f}s  {case.flops(n) / 1e9:.2f} GFLOP')
  if len(outputs) == 2:
    error = np.abs(outputs['performer_causal_blocked']
                   - outputs['performer_causal_dense_mask']).max()
    print(f'blocked vs dense mask: max |difference| {error:.2e}')
    assert error < 1e-4, error


if __name__ == '__main__':
  main()

"""Attention-scaling cases for the Performer, FAVOR+ (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, no padding.
Causal softmax-kernel attention with m = 256 positive orthogonal random
features (fixed: `PRNGKey(0)`), blocks of 64 positions.

- `performer_causal_blocked`: the library's fast path, a scan over blocks
  with carried prefix sums S = sum phi(k) v^T, z = sum phi(k): O(n m d).
- `performer_causal_dense_mask`: the same computation as the paper writes it
  before associativity: the n x n matrix phi(Q) phi(K)^T under the causal
  mask, times V, over its row sums: O(n^2 m) (skipped above 4k).

Bidirectional (an encoder's rows, `kernel.bidirectional_performer_attention`), the same
features and blocks:

- `performer_bidirectional_whole_row`: the path rows of one document take: every query
  reads the whole row's S and z, two matmuls, no scan.
- `performer_bidirectional_two_scans`: the path rows of several documents take, forced
  here on one document: the causal scan forward and again over the reversed row.

`flops(n)` counts the useful work of the linear form, for both rows: the
feature maps (2 n h d m each for queries and keys) and, per token, the update
and the read of S and z (2 h m (d + 1) each).

Quick check (each case once at one length, blocked vs dense-mask agreement):
  python -m benchmarks.performer_cases --seq_len=1024
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase, quick_check
from benchmarks.sparse_cases import HEAD_DIM, HEADS, make_qkv, one_document
from longformer_jax.attention.performer import kernel as performer_kernel
from longformer_jax.attention.performer import random_features

NUM_FEATURES, BLOCK_LEN = 256, 64
DENSE_MAX_LEN = 4096


@functools.lru_cache(maxsize=None)
def fixed_features() -> np.ndarray:
  with jax.ensure_compile_time_eval():
    return np.asarray(random_features.random_feature_matrix(
        jax.random.PRNGKey(0), NUM_FEATURES, HEAD_DIM))


def performer_blocked(q, k, v):
  empty = performer_kernel.empty_state(1, HEADS, NUM_FEATURES, HEAD_DIM)
  out, _ = performer_kernel.causal_performer_attention(
      q, k, v, *one_document(q.shape[1]), jnp.asarray(fixed_features()), empty,
      block_len=BLOCK_LEN)
  return out


def performer_dense_mask(q, k, v):
  """phi(Q) phi(K)^T `[1, h, n, n]` under the causal mask; one key shift per head and
  feature over the whole sequence."""
  w = jnp.asarray(fixed_features())
  n = q.shape[1]
  logits = random_features.softmax_logits(k, w)
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
  phi_k = jnp.exp(logits - shift)
  phi_q = performer_kernel.shifted_query_features(random_features.softmax_logits(q, w), shift)
  causal = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]
  scores = jnp.einsum('bqhm,bkhm->bhqk', phi_q, phi_k) * causal
  out = jnp.einsum('bhqk,bkhd->bqhd', scores, v)
  return out / jnp.swapaxes(jnp.sum(scores, axis=-1), 1, 2)[..., None]


def performer_bidirectional(path):
  def attention(q, k, v):
    return path(q, k, v, *one_document(q.shape[1]), jnp.asarray(fixed_features()),
                kernel='softmax', block_len=BLOCK_LEN, relu_eps=performer_kernel.RELU_EPS)
  return attention


def performer_flops(n: int) -> float:
  features = 2 * 2.0 * n * HEADS * HEAD_DIM * NUM_FEATURES
  prefix_sums = 2 * 2.0 * n * HEADS * NUM_FEATURES * (HEAD_DIM + 1)
  return features + prefix_sums


CASES = [
    AttentionCase('performer_causal_blocked', make_qkv, performer_blocked, performer_flops),
    AttentionCase('performer_causal_dense_mask', make_qkv, performer_dense_mask, performer_flops,
                  max_seq_len=DENSE_MAX_LEN),
    AttentionCase('performer_bidirectional_whole_row', make_qkv,
                  performer_bidirectional(performer_kernel.whole_row_attention),
                  performer_flops),
    AttentionCase('performer_bidirectional_two_scans', make_qkv,
                  performer_bidirectional(performer_kernel.two_scan_attention),
                  performer_flops),
]



def main() -> None:
  quick_check(CASES, __doc__.splitlines()[0])


if __name__ == '__main__':
  main()

"""Attention-scaling cases for ETC global-local attention (benchmarks/attention_scaling.py).

Shapes as the other sweeps: batch 1, 8 heads of 64, one document, no padding.
Structure as the paper's long documents: a sentence every 256 tokens, whose
first token is its global token (at most 64 global tokens, so 64 sentences at
16k), `structure='sentence'`, l2l radius k = 256 (2k + 1 = 513 keys, about
the window of 512 of the other sweeps). Inputs: q, k, v `[1, n, 8, 64]` and
the label vectors a_l `[2k + 3, 8, 64]`.

`etc_blocked` is the library's fast path (attention/etc.py);
`etc_dense_mask` writes the same rules (docs/variants.md, ETC) for every
pair of the n x n matrix with numpy, takes the label of every pair from
`q . a_l` and runs dense masked attention (skipped above 4k: it holds n x n
logits and the n x n x heads gathered label logits). `flops(n)` counts
4 * head_dim * heads per allowed (query, key) pair, counted exactly.

Quick check (both cases at one length, fast vs dense-mask agreement):
  python -m benchmarks.etc_cases --seq_len=1024
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.attention_case import AttentionCase, quick_check
from benchmarks.sparse_cases import HEAD_DIM, HEADS, one_document, scaled
from longformer_jax.attention import etc
from longformer_jax.attention.core.dot_product import attend

RADIUS, SENTENCE, MAX_GLOBAL = 256, 256, 64
DENSE_MAX_LEN = 4096


def make_inputs(n: int, key: jax.Array) -> tuple:
  """q, k, v `[1, n, 8, 64]`; the label vectors `[2k + 3, 8, 64]`."""
  keys = jax.random.split(key, 4)
  qkv = tuple(jax.random.normal(k, (1, n, HEADS, HEAD_DIM)) for k in keys[:3])
  return qkv + (0.1 * jax.random.normal(keys[3], (etc.num_labels(RADIUS), HEADS, HEAD_DIM)),)


def sentence_flags(n: int) -> jax.Array:
  return (jnp.arange(n) % SENTENCE == 0)[None]


def etc_blocked(q, k, v, rel_keys):
  n = q.shape[1]
  return etc.etc_attention(scaled(q), k, v, rel_keys, *one_document(n), sentence_flags(n),
                           radius=RADIUS, max_global=MAX_GLOBAL, structure='sentence')


def dense_rules(n: int) -> tuple[np.ndarray, np.ndarray]:
  """`(allowed [n, n] bool, labels [n, n] int32)` from the rules, every pair at once (numpy)."""
  t = np.arange(n)
  is_global = (t % SENTENCE == 0) & (t // SENTENCE < MAX_GLOBAL)
  rank = sentence = np.minimum(t // SENTENCE, MAX_GLOBAL - 1)     # a global's rank; a token's
  gq, gk = is_global[:, None], is_global[None, :]                 # sentence (n <= 16k)
  clip = lambda d: np.clip(d, -RADIUS, RADIUS) + RADIUS
  linked = sentence[:, None] == sentence[None, :]
  special = np.where(linked, 2 * RADIUS + 1, 2 * RADIUS + 2)
  labels = np.where(gq & gk, clip(rank[None, :] - rank[:, None]),
                    np.where(gq | gk, special, clip(t[None, :] - t[:, None])))
  allowed = np.where(gq & gk, True,
                     np.where(gq | gk, linked, np.abs(t[None, :] - t[:, None]) <= RADIUS))
  return allowed, labels.astype(np.int32)


def etc_dense_mask(q, k, v, rel_keys):
  n = q.shape[1]
  allowed, labels = dense_rules(n)
  q = scaled(q)
  rel_logits = jnp.einsum('bqhd,lhd->bqhl', q, rel_keys)               # [1, n, h, L]
  index = jnp.broadcast_to(jnp.asarray(labels)[None, :, None, :], (1, n, HEADS, n))
  bias = jnp.moveaxis(jnp.take_along_axis(rel_logits, index, axis=-1), 2, 1)
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) + bias
  return attend(logits, jnp.asarray(allowed)[None], v)


@functools.lru_cache(maxsize=None)
def allowed_pairs(n: int) -> int:
  """Allowed (query, key) pairs, counted per query with the rules (no n x n array)."""
  t = np.arange(n)
  is_global = (t % SENTENCE == 0) & (t // SENTENCE < MAX_GLOBAL)
  long_before = np.concatenate([[0], np.cumsum(~is_global)])      # long tokens in [0, t)
  lo, hi = np.maximum(t - RADIUS, 0), np.minimum(t + RADIUS + 1, n)
  window = long_before[hi] - long_before[lo]
  sentence = t // SENTENCE
  sentence_longs = np.bincount(sentence[~is_global], minlength=sentence.max() + 1)
  pairs = np.where(is_global, is_global.sum() + sentence_longs[sentence], window + 1)
  return int(pairs.sum())


CASES = [
    AttentionCase('etc_blocked', make_inputs, etc_blocked,
                  lambda n: 4.0 * HEADS * HEAD_DIM * allowed_pairs(n)),
    AttentionCase('etc_dense_mask', make_inputs, etc_dense_mask,
                  lambda n: 4.0 * HEADS * HEAD_DIM * allowed_pairs(n), max_seq_len=DENSE_MAX_LEN),
]


def main() -> None:
  quick_check(CASES, __doc__.splitlines()[0])


if __name__ == '__main__':
  main()

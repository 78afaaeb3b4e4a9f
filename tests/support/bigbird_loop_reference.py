"""BigBird's block pattern written as a loop over (query, key) pairs, its random-block table, and
the mask they make on the splash tests' inputs."""

import numpy as np

from longformer_jax.attention.bigbird import attention as bigbird
from tests.support.splash_mask_reference import chunk_facts

BB = dict(block=16, window_blocks=1, global_blocks=1)


def bigbird_loop(i: int, j: int, table, block: int, window_blocks: int, global_blocks: int,
                 causal: bool, global_rows: bool = False) -> bool:
  """BigBird (bigbird/attention.py's docstring): window | random | global key (| global query)."""
  if causal and j > i:
    return False
  bi, bj = i // block, j // block
  return (abs(bi - bj) <= window_blocks or bj in table[bi] or bj < global_blocks
          or (global_rows and bi < global_blocks))


def reference_mask(head_rules, chunk: int, valid_global_rows=None) -> np.ndarray:
  """`[B, heads, q, k]`: each head's loop rule on relative positions, documents, padding."""
  positions, segments, valid = chunk_facts(chunk)
  rel = positions[0] - positions[0, 0]
  docs = (segments[:, :, None] == segments[:, None, :]) & valid[:, None, :]
  heads = []
  for rule in head_rules:
    full = np.array([[rule(i, j) for j in rel] for i in rel])
    heads.append(full[None] & docs)
  return np.stack(heads, axis=1)


def random_table(num_blocks: int, causal: bool, seed: int = 5, layer: int = 1):
  r = bigbird.random_block_pattern(bigbird.pattern_key(seed, layer), num_blocks, 2,
                                   BB['window_blocks'], BB['global_blocks'], causal)
  return tuple(tuple(int(b) for b in row) for row in np.asarray(r))

"""Attention masks as functions of positions (docs/design.md, contract 2).

No mask here looks at array slots: memory entries, chunk tokens, evicted or
retrieved entries all carry positions, segment ids and valid bits, and one
rule compares queries with keys.
"""

import jax


def causal_document_mask(q_positions: jax.Array, q_segments: jax.Array,
                         k_positions: jax.Array, k_segments: jax.Array,
                         k_valid: jax.Array, *, causal: bool = True) -> jax.Array:
  """`[batch, q]` queries x `[batch, k]` keys -> `[batch, q, k]` bool.

  A query may attend to a key iff the key is valid, belongs to the same
  document, and (if causal) is not in its future.
  """
  allowed = k_valid[:, None, :] & (q_segments[:, :, None] == k_segments[:, None, :])
  if causal:
    allowed &= k_positions[:, None, :] <= q_positions[:, :, None]
  return allowed

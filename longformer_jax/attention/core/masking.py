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


def hide_predicted_ahead(allowed: jax.Array, q_positions: jax.Array, k_positions: jax.Array,
                         k_predicted: jax.Array) -> jax.Array:
  """`allowed [batch, q, k]` less the keys after a query that are predicted (`k_predicted
  [batch, k]`, targets of the next-token loss): a prefix-LM mask (Raffel et al., 2020,
  sec. 3.2.1) for queries that see later keys. A query then never reads a token that it,
  or a later query reading its output, predicts."""
  ahead = k_positions[:, None, :] > q_positions[:, :, None]
  return allowed & ~(ahead & k_predicted[:, None, :])

"""HIBERT's document masking (Zhang et al., 2019, sec. 3.2), from an explicit PRNG key.

For each document (row) with n real sentences, k = clip(ceil(mask_rate * n),
1, P) distinct sentences are picked uniformly (P = `max_predictions`); each
picked sentence is, independently, replaced by [MASK] tokens with probability
`replace_mask` (every real token but the leading BOS becomes MASK, so the
length stays), by a random real sentence of the batch with probability
`replace_random`, and otherwise left unchanged. Only picked sentences are
predicted (and scored).

Row r draws from `fold_in(key, example_index[r])`, so the picks of an example
do not depend on which batch it is in; only the random sentence's source is
drawn from the batch. Evaluation passes a fixed key: the masks are the same
every time.
"""

import jax
import jax.numpy as jnp

KEEP, MASK, RANDOM, UNCHANGED = 0, 1, 2, 3   # per-sentence actions (KEEP: not picked)


def _mask_row(key, tokens, token_mask, sentence_mask, all_tokens, all_masks, real_before, *,
              mask_rate, replace_mask, replace_random, max_predictions, mask_id):
  """One document `[S, T]`; `all_*` are the batch's sentences flattened `[b * S, ...]`,
  `real_before [b * S]` the cumulative count of real sentences among them."""
  pick_key, action_key, source_key = jax.random.split(key, 3)
  n = jnp.sum(sentence_mask)
  k = jnp.clip(jnp.ceil(mask_rate * n - 1e-6).astype(jnp.int32), 1, max_predictions)
  scores = jnp.where(sentence_mask, jax.random.uniform(pick_key, sentence_mask.shape), -1.0)
  _, positions = jax.lax.top_k(scores, max_predictions)                     # [P], distinct
  slot_valid = (jnp.arange(max_predictions) < k) & sentence_mask[positions]
  u = jax.random.uniform(action_key, (max_predictions,))
  action = jnp.where(u < replace_mask, MASK,
                     jnp.where(u < replace_mask + replace_random, RANDOM, UNCHANGED))
  action = jnp.where(slot_valid, action, KEEP)
  # A uniform real sentence of the batch: the r-th, r uniform below their number.
  r = jax.random.randint(source_key, (max_predictions,), 0, jnp.maximum(real_before[-1], 1))
  source = jnp.searchsorted(real_before, r, side='right')
  original, original_mask = tokens[positions], token_mask[positions]       # [P, T]
  not_bos = jnp.arange(tokens.shape[-1]) > 0
  masked = jnp.where(original_mask & not_bos, mask_id, original)
  new = jnp.where((action == MASK)[:, None], masked,
                  jnp.where((action == RANDOM)[:, None], all_tokens[source], original))
  new_mask = jnp.where((action == RANDOM)[:, None], all_masks[source], original_mask)
  per_sentence = jnp.zeros(sentence_mask.shape, jnp.int32).at[positions].set(action)
  return (tokens.at[positions].set(new), token_mask.at[positions].set(new_mask), positions,
          slot_valid, per_sentence)


def mask_sentences(key, tokens, token_mask, sentence_mask, example_index, *, mask_rate: float,
                   replace_mask: float, replace_random: float, max_predictions: int,
                   mask_id: int) -> dict:
  """Masks the documents `tokens [b, S, T]` (`token_mask [b, S, T]`, `sentence_mask [b, S]`).

  Returns `tokens`, `token_mask` (the encoder's input), `positions [b, P]`
  int32 (the picked sentences), `slot_valid [b, P]` (slot j holds a picked
  sentence) and `action [b, S]` (KEEP | MASK | RANDOM | UNCHANGED).
  """
  b, s, t = tokens.shape
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(example_index)
  row = lambda k, x, m, v: _mask_row(
      k, x, m, v, tokens.reshape(b * s, t), token_mask.reshape(b * s, t),
      jnp.cumsum(sentence_mask.reshape(b * s).astype(jnp.int32)), mask_rate=mask_rate, replace_mask=replace_mask,
      replace_random=replace_random, max_predictions=max_predictions, mask_id=mask_id)
  new, new_mask, positions, slot_valid, action = jax.vmap(row)(
      keys, tokens, token_mask, sentence_mask.astype(bool))
  return dict(tokens=new, token_mask=new_mask, positions=positions.astype(jnp.int32),
              slot_valid=slot_valid, action=action)

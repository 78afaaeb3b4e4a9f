"""BERT's token masking (Devlin et al., 2019, sec. 3.1), for self-pretraining on a task's inputs.

`config.data.masking` (read by task `masked_pretraining`, tasks/masked_pretraining.py): each
maskable token is picked with probability `rate`; a picked token becomes [MASK] with
probability `replace_mask`, a uniformly random token of the vocabulary with probability
`replace_random`, and stays itself otherwise (BERT: 0.15; 0.8 / 0.1 / 0.1). The loss is
read at the picked positions only. Picks are independent per token, so the number picked
per example varies around `rate` x the maskable tokens; an example may have none.
`masking_key` is the randomness of a batch's masks, for this masking and HIBERT's
(tasks/sentence_mask.py): a training step's own, an evaluation's always the same.
"""

import dataclasses

import jax
import jax.numpy as jnp

from longformer_jax.config.section import Section

EVAL_MASK_SEED = 0          # evaluation masks: always the same


@dataclasses.dataclass(frozen=True)
class TokenMaskingConfig(Section):
  """`config.data.masking`: which tokens the masked-token objective hides, and how."""
  rate: float = 0.15             # probability that a maskable token is picked
  replace_mask: float = 0.8      # a picked token becomes [MASK] with this probability,
  replace_random: float = 0.1    # a random vocabulary token with this one, else stays

  def validate(self, env) -> None:
    del env
    self.require(0.0 < self.rate <= 1.0, 'rate', 'must be in (0, 1]')
    for name in ('replace_mask', 'replace_random'):
      self.require(0.0 <= getattr(self, name) <= 1.0, name, 'must be in [0, 1]')
    self.require(self.replace_mask + self.replace_random <= 1.0, 'replace_random',
                 f'replace_mask + replace_random = {self.replace_mask + self.replace_random} '
                 'must be <= 1 (the rest of the picked tokens stay themselves)')


def masking_key(rngs: dict, salt: int) -> jax.Array:
  """Training (`rngs` holds the step's 'dropout' key): that key folded with `salt` (each
  objective its own); evaluation (no dropout key): `PRNGKey(EVAL_MASK_SEED)`."""
  if 'dropout' in rngs:
    return jax.random.fold_in(rngs['dropout'], salt)
  return jax.random.PRNGKey(EVAL_MASK_SEED)


def mask_tokens(key: jax.Array, tokens: jax.Array, maskable: jax.Array, *, rate: float,
                replace_mask: float, replace_random: float, mask_id: int,
                vocab_size: int) -> tuple[jax.Array, jax.Array]:
  """`(masked_tokens [b, L] int32, picked [b, L] bool)` for `tokens [b, L]`.

  Args:
    key: the randomness of this batch (a training step's, or a fixed evaluation key).
    tokens: the original token ids, `[batch, length]`.
    maskable: `[batch, length]` bool, True where a token may be picked (real content: no
      padding, no [CLS]).
    rate, replace_mask, replace_random: `TokenMaskingConfig`'s values.
    mask_id: the [MASK] id (outside the tokenizer's vocabulary: `vocab_size`).
    vocab_size: random replacements are drawn from ids `[0, vocab_size)`.
  """
  pick_key, how_key, random_key = jax.random.split(key, 3)
  picked = (jax.random.uniform(pick_key, tokens.shape) < rate) & maskable
  how = jax.random.uniform(how_key, tokens.shape)
  random_tokens = jax.random.randint(random_key, tokens.shape, 0, vocab_size, tokens.dtype)
  replaced = jnp.where(how < replace_mask, jnp.asarray(mask_id, tokens.dtype),
                       jnp.where(how < replace_mask + replace_random, random_tokens, tokens))
  return jnp.where(picked, replaced, tokens), picked

"""Choosing the next token from the model's logits: greedy, temperature, top-k, top-p.

Pure functions of `logits [vocab]` (vmap them for a batch) and an explicit
`jax.random` key, so a fixed seed reproduces a sample exactly. The settings
apply in the usual order (as in Hugging Face's `generate`): the logits are
divided by the temperature, then top-k keeps the k most likely tokens, then
top-p keeps the nucleus of what is left (Holtzman et al., 2020, "The Curious
Case of Neural Text Degeneration", sec. 3.1), and a token is drawn from the
renormalised survivors. Temperature 0 is greedy decoding (the most likely
token; the lowest id among equals).

Ties are kept together, so the survivors never depend on how a sort orders
equal values:
  top-k   keeps every token whose logit is >= the k-th largest logit
          (more than k survive when several share the k-th value);
  top-p   keeps every token whose strictly more probable tokens hold less than
          p of the probability: the smallest set of most likely tokens whose
          mass reaches p, plus every token as likely as the last one taken.
k = 0 and p = 1 turn the filters off; the most likely token always survives.
"""

import dataclasses

import jax
import jax.numpy as jnp


class SamplingError(ValueError):
  """A sampling setting is out of range; `setting` names it (`top_p`, ...)."""

  def __init__(self, setting: str, message: str):
    self.setting = setting
    super().__init__(f'{setting}: {message}')


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """How the next token is chosen (hashable: a static argument of `jax.jit`)."""
  temperature: float = 1.0   # 0: greedy; < 1 sharper, > 1 flatter
  top_k: int = 0             # keep the k most likely tokens (0: off)
  top_p: float = 1.0         # keep the nucleus holding p of the probability (1: off)

  def validate(self) -> 'SamplingSettings':
    """Returns self; raises `SamplingError` naming the first bad setting."""
    if not self.temperature >= 0 or self.temperature == float('inf'):
      raise SamplingError('temperature', f'{self.temperature} must be >= 0 and finite '
                          '(0: greedy)')
    if self.top_k < 0:
      raise SamplingError('top_k', f'{self.top_k} must be >= 0 (0: off)')
    if not 0 < self.top_p <= 1:
      raise SamplingError('top_p', f'{self.top_p} must be in (0, 1] (1: off)')
    return self

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def top_k_mask(logits: jax.Array, k) -> jax.Array:
  """bool `[vocab]`: the tokens top-k keeps (ties at the k-th value kept; k = 0: all).

  `k` may be traced: the k-th largest logit is read from the sorted logits.
  """
  vocab = logits.shape[-1]
  ascending = jnp.sort(logits)
  kth_largest = ascending[jnp.clip(vocab - k, 0, vocab - 1)]
  return (k <= 0) | (k >= vocab) | (logits >= kth_largest)


def top_p_mask(logits: jax.Array, p) -> jax.Array:
  """bool `[vocab]`: the tokens whose strictly more probable tokens hold < p (p >= 1: all).

  With probabilities sorted in descending order, the mass strictly above a
  token is the exclusive prefix sum at the first sorted slot of its value
  (every more probable token comes before it, every equal one after). `p`
  may be traced.
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32))
  ascending = jnp.sort(probs)
  descending = ascending[::-1]
  mass_before = jnp.cumsum(descending) - descending            # exclusive prefix sums
  num_greater = probs.shape[-1] - jnp.searchsorted(ascending, probs, side='right')
  return (p >= 1) | (mass_before[num_greater] < p)


def filtered_logits(logits: jax.Array, settings: SamplingSettings) -> jax.Array:
  """float32 `[vocab]`: `logits / temperature` with the filtered-out tokens at -inf.

  Temperature must be > 0 (greedy decoding does not filter)."""
  scaled = logits.astype(jnp.float32) / settings.temperature
  scaled = jnp.where(top_k_mask(scaled, settings.top_k), scaled, -jnp.inf)
  return jnp.where(top_p_mask(scaled, settings.top_p), scaled, -jnp.inf)


def sample_token(logits: jax.Array, key: jax.Array, settings: SamplingSettings) -> jax.Array:
  """int32 scalar: the next token for `logits [vocab]` (tokens to avoid set to -inf).

  Greedy (temperature 0) ignores `key`, top-k and top-p.
  """
  if settings.greedy:
    return jnp.argmax(logits).astype(jnp.int32)
  return jax.random.categorical(key, filtered_logits(logits, settings)).astype(jnp.int32)


def step_key(seed: int, step: int) -> jax.Array:
  """The key of generation step `step` (0-based): `fold_in(PRNGKey(seed), step)`."""
  return jax.random.fold_in(jax.random.PRNGKey(seed), step)

"""Sampling (generation/sampling.py) against plain numpy: which tokens top-k and top-p keep
(ties, k = 0 and p = 1 meaning off), temperature, greedy, seeded draws."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.generation.sampling import (SamplingError, SamplingSettings, filtered_logits,
                                                sample_token, step_key, top_k_mask, top_p_mask)


def numpy_top_k(logits: np.ndarray, k: int) -> np.ndarray:
  """Survivors of top-k: every token at least as likely as the k-th most likely one."""
  if k == 0 or k >= logits.size:
    return np.ones(logits.shape, bool)
  kth = np.sort(logits)[::-1][k - 1]
  return logits >= kth


def numpy_top_p(logits: np.ndarray, p: float) -> np.ndarray:
  """Survivors of top-p, pair by pair in float64: the tokens whose strictly more probable
  tokens hold less than p of the probability."""
  if p >= 1:
    return np.ones(logits.shape, bool)
  z = np.exp(logits.astype(np.float64) - logits.max())
  probs = z / z.sum()
  return np.array([probs[probs > probs[i]].sum() < p for i in range(probs.size)])


def numpy_mass_above(logits: np.ndarray) -> np.ndarray:
  z = np.exp(logits.astype(np.float64) - logits.max())
  probs = z / z.sum()
  return np.array([probs[probs > probs[i]].sum() for i in range(probs.size)])


top_k_mask = jax.jit(top_k_mask)        # one program for every k (traced)
top_p_mask = jax.jit(top_p_mask)


def random_logits(seed: int, vocab: int = 50) -> np.ndarray:
  return (np.random.default_rng(seed).standard_normal(vocab) * 2).astype(np.float32)


@pytest.mark.parametrize('k', [0, 1, 2, 7, 49, 50, 80])
def test_top_k_keeps_the_numpy_survivors(k):
  for seed in range(3):
    logits = random_logits(seed)
    np.testing.assert_array_equal(np.asarray(top_k_mask(jnp.asarray(logits), k)),
                                  numpy_top_k(logits, k))


def test_top_k_keeps_every_token_tied_with_the_kth():
  logits = np.array([1., 3., 3., 2., 3., 0.], np.float32)
  for k, kept in [(1, [1, 2, 4]), (2, [1, 2, 4]), (3, [1, 2, 4]), (4, [1, 2, 3, 4]), (0, range(6))]:
    mask = np.asarray(top_k_mask(jnp.asarray(logits), k))
    assert np.flatnonzero(mask).tolist() == list(kept)
    np.testing.assert_array_equal(mask, numpy_top_k(logits, k))


@pytest.mark.parametrize('p', [0.05, 0.3, 0.5, 0.8, 0.95, 0.999, 1.0])
def test_top_p_keeps_the_numpy_survivors(p):
  for seed in range(4):
    logits = random_logits(seed)
    # Away from the boundary, float32 and float64 agree on every token.
    assert np.min(np.abs(numpy_mass_above(logits) - p)) > 1e-5 or p == 1.0
    np.testing.assert_array_equal(np.asarray(top_p_mask(jnp.asarray(logits), p)),
                                  numpy_top_p(logits, p))


def test_top_p_keeps_ties_together_and_the_most_likely_token():
  logits = np.array([0., 2., 1., 1., 1., -1.], np.float32)   # one top token, three tied
  top = np.exp(2.) / np.exp(logits).sum()
  for p, kept in [(1e-6, [1]), (top - 1e-3, [1]), (top + 1e-3, [1, 2, 3, 4]),
                  (0.999, [0, 1, 2, 3, 4, 5]), (1.0, [0, 1, 2, 3, 4, 5])]:
    mask = np.asarray(top_p_mask(jnp.asarray(logits), p))
    assert np.flatnonzero(mask).tolist() == kept, p
    np.testing.assert_array_equal(mask, numpy_top_p(logits, p))
  flat = np.zeros(8, np.float32)                              # all tied: all kept, any p
  assert np.asarray(top_p_mask(jnp.asarray(flat), 0.01)).all()


def test_filters_apply_after_the_temperature_top_k_first():
  logits = random_logits(7)
  for temperature, k, p in [(0.5, 0, 0.6), (2.0, 0, 0.6), (1.0, 10, 0.5), (0.7, 5, 1.0)]:
    settings = SamplingSettings(temperature=temperature, top_k=k, top_p=p)
    scaled = logits / np.float32(temperature)
    kept = numpy_top_k(scaled, k)
    kept &= numpy_top_p(np.where(kept, scaled, -np.inf), p)
    got = np.asarray(filtered_logits(jnp.asarray(logits), settings))
    np.testing.assert_array_equal(np.isfinite(got), kept)
    np.testing.assert_allclose(got[kept], scaled[kept], rtol=1e-6)
  sharp, flat = (np.isfinite(np.asarray(filtered_logits(
      jnp.asarray(logits), SamplingSettings(temperature=t, top_p=0.6)))).sum() for t in (0.3, 3.0))
  assert sharp < flat                                          # the temperature changes the set


def test_greedy_takes_the_most_likely_token_lowest_id_among_ties():
  logits = jnp.asarray([0., 5., 1., 5.])
  greedy = SamplingSettings(temperature=0.0, top_k=1)
  assert int(sample_token(logits, step_key(0, 0), greedy)) == 1
  assert int(sample_token(logits, step_key(9, 3), greedy)) == 1


def test_draws_stay_among_survivors_follow_their_probabilities_and_repeat_with_the_key():
  logits = random_logits(3, vocab=12) * 0.4
  settings = SamplingSettings(temperature=0.8, top_k=6, top_p=0.9)
  kept_logits = np.asarray(filtered_logits(jnp.asarray(logits), settings), np.float64)
  probs = np.exp(kept_logits - kept_logits[np.isfinite(kept_logits)].max())
  probs /= probs.sum()
  draw = jax.jit(jax.vmap(lambda seed, i: sample_token(jnp.asarray(logits), step_key(seed, i),
                                                      settings), in_axes=(None, 0)))
  draws = np.asarray(draw(5, jnp.arange(4000)))
  assert set(draws.tolist()) <= set(np.flatnonzero(probs > 0).tolist())
  frequencies = np.bincount(draws, minlength=12) / draws.size
  np.testing.assert_allclose(frequencies, probs, atol=0.03)
  np.testing.assert_array_equal(draws, np.asarray(draw(5, jnp.arange(4000))))
  assert (np.asarray(draw(6, jnp.arange(4000))) != draws).mean() > 0.3


@pytest.mark.parametrize('settings,setting', [
    (SamplingSettings(temperature=-0.1), 'temperature'),
    (SamplingSettings(temperature=float('nan')), 'temperature'),
    (SamplingSettings(top_k=-1), 'top_k'),
    (SamplingSettings(top_p=0.0), 'top_p'),
    (SamplingSettings(top_p=1.5), 'top_p'),
])
def test_bad_settings_name_the_setting(settings, setting):
  with pytest.raises(SamplingError, match=f'^{setting}: ') as error:
    settings.validate()
  assert error.value.setting == setting
  assert SamplingSettings(temperature=0, top_k=0, top_p=1).validate().greedy

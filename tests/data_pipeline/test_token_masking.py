"""BERT's token masking (data/token_masking.py): the frequencies against 15% and 80 / 10 / 10,
counted with numpy over many tokens; what is never picked; the settings' checks."""

import jax
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.token_masking import TokenMaskingConfig, mask_tokens

VOCAB = 250
MASK_ID = VOCAB


def draw(rate=0.15, replace_mask=0.8, replace_random=0.1, seed=0, shape=(64, 512)):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, shape).astype(np.int32)
  maskable = rng.random(shape) < 0.9
  masked, picked = jax.jit(lambda k, t, m: mask_tokens(
      k, t, m, rate=rate, replace_mask=replace_mask, replace_random=replace_random,
      mask_id=MASK_ID, vocab_size=VOCAB))(jax.random.PRNGKey(seed), tokens, maskable)
  return tokens, maskable, np.asarray(masked), np.asarray(picked)


def test_picks_15_percent_of_the_maskable_tokens_and_replaces_80_10_10():
  tokens, maskable, masked, picked = draw()
  assert not picked[~maskable].any()
  np.testing.assert_array_equal(masked[~picked], tokens[~picked])   # unpicked: untouched
  assert abs(picked.sum() / maskable.sum() - 0.15) < 0.01          # ~26,000 maskable tokens
  became = masked[picked]
  was = tokens[picked]
  to_mask = np.mean(became == MASK_ID)
  unchanged = np.mean(became == was)
  random = np.mean((became != MASK_ID) & (became != was))
  # A random draw equal to the token itself (1 in VOCAB) counts as unchanged.
  assert abs(to_mask - 0.8) < 0.025
  assert abs(unchanged - (0.1 + 0.1 / VOCAB)) < 0.02
  assert abs(random - 0.1 * (1 - 1 / VOCAB)) < 0.02
  assert became.max() <= MASK_ID and became[became != MASK_ID].max() < VOCAB
  assert became.min() >= 0


def test_rate_one_with_only_mask_replacements_masks_every_maskable_token():
  tokens, maskable, masked, picked = draw(rate=1.0, replace_mask=1.0, replace_random=0.0)
  np.testing.assert_array_equal(picked, maskable)
  np.testing.assert_array_equal(masked, np.where(maskable, MASK_ID, tokens))


def test_the_key_decides_the_masks():
  _, _, masked_a, picked_a = draw(seed=0)
  _, _, masked_b, picked_b = draw(seed=0)
  np.testing.assert_array_equal(picked_a, picked_b)
  np.testing.assert_array_equal(masked_a, masked_b)
  tokens = np.zeros((4, 256), np.int32)
  maskable = np.ones((4, 256), bool)
  kwargs = dict(rate=0.15, replace_mask=0.8, replace_random=0.1, mask_id=MASK_ID,
                vocab_size=VOCAB)
  one = np.asarray(mask_tokens(jax.random.PRNGKey(1), tokens, maskable, **kwargs)[1])
  two = np.asarray(mask_tokens(jax.random.PRNGKey(2), tokens, maskable, **kwargs)[1])
  assert (one != two).any()


@pytest.mark.parametrize('values, key', [
    ({'rate': 0.0}, 'rate'),
    ({'rate': 1.5}, 'rate'),
    ({'replace_mask': -0.1}, 'replace_mask'),
    ({'replace_random': 1.2}, 'replace_random'),
    ({'replace_mask': 0.8, 'replace_random': 0.3}, 'replace_random'),
    ({'ratio': 0.2}, 'ratio'),
])
def test_bad_masking_settings_name_the_key(values, key):
  with pytest.raises(ConfigError) as error:
    TokenMaskingConfig.build(values, 'data.masking')
  assert error.value.key == f'data.masking.{key}'

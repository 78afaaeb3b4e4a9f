"""Adversarial inputs for every registered attention variant (docs/design.md, contracts 1, 2).

Runs on the compiled two-chunk runners of tests/support/contract_checks.py
(`harness`, same shapes: nothing new is compiled). Inputs whose scales range
from 0.05 to 30 make logits (and Performer's log-features) of one row differ
by far more than 100 nats: within a document, between the two documents of a
chunk (row 0 starts document 1 at slot 1 of its first chunk) and inside one
causal block. Padded slots carry real-looking positions and document ids.
Checked, each by a comparison that an underflow or a leak would break:

- outputs and gradients are finite (`NON_FINITE_GRADIENTS`: known defects,
  asserted to be still there; empty now);
- every valid output is nonzero (a query sees at least itself: 0 is an
  underflow);
- valid outputs do not depend on the tokens of the document before them in
  the chunk (near tokens turned far) nor on what padded slots hold;
- causal variants: a valid output does not depend on later tokens;
- a fully padded row (reset) gives exactly zero, with finite gradients.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.registry import attention_layer
from tests.support.adversarial_inputs import (BOUNDARY, NON_FINITE_GRADIENTS, SCALES,
                                              adversarial_context, assert_same, run_checked)
from tests.support.contract_checks import (B, C, K, VARIANTS, harness, random_inputs, row,
                                           tiny_attention_config)


def scaled(seed: int, scales=SCALES) -> jnp.ndarray:
  return random_inputs(seed) * jnp.asarray(np.broadcast_to(scales, (K, B, C))[..., None],
                                            jnp.float32)


def is_causal(name: str) -> bool:
  """The layer's `causal` setting (its shared settings)."""
  return attention_layer(tiny_attention_config(name), jnp.float32).shared.causal


@pytest.mark.parametrize('name', VARIANTS)
def test_adversarial_logit_ranges_documents_and_padding(name):
  h = harness(name)
  ctx, valid = adversarial_context()
  xs = scaled(11)
  base, finite = run_checked(h, xs, ctx, name)
  # Every valid query sees at least itself: an output of exactly 0 is an underflow.
  assert (np.abs(base[valid]).max(-1) > 0).all(), f'{name}: a valid output underflowed to 0'

  # Row 0's first document (near tokens) and every padded slot replaced by far tokens: no
  # valid output of document 1 or of row 1 changes.
  before = np.zeros((K, B, C), bool)
  before[0, 0, :BOUNDARY] = True
  swap = jnp.asarray((before | ~valid)[..., None])
  changed, finite_changed = run_checked(h, jnp.where(swap, scaled(12, 30.0), xs), ctx, name)
  assert_same(changed, base, valid & ~before, f'{name}: a valid output sees the document '
              'before it or padded slots')

  finite_later = True
  if is_causal(name):   # later tokens (near ones turned far) change no earlier output
    later = np.zeros((K, B, C), bool)
    later[0, :, 6:] = later[1] = True
    changed, finite_later = run_checked(h, jnp.where(jnp.asarray(later[..., None]),
                                                     scaled(13, 30.0), xs), ctx, name)
    assert_same(changed, base, valid & ~later, f'{name}: an output sees later tokens')

  ctx, _ = adversarial_context(fully_padded_row=True)
  ys, _ = run_checked(h, xs, ctx, name)
  np.testing.assert_array_equal(row(ys, 0), 0.0, err_msg=f'{name}: padded row is not zero')
  assert np.abs(row(ys, 1)).sum() > 0
  if name in NON_FINITE_GRADIENTS:
    assert not (finite and finite_changed and finite_later), \
        f'{name}: gradients are finite now; remove it from NON_FINITE_GRADIENTS'

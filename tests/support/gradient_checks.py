"""Gradient comparison of a fast path against its reference, shared by the attention tests."""

import jax
import numpy as np


def assert_gradients_match(fast_loss, reference_loss, args, *, rtol=1e-4, atol=1e-5):
  """Gradients of two scalar losses with respect to every argument in `args` agree.

  The fast loss is jitted (as it runs in training); the reference is not.
  """
  argnums = tuple(range(len(args)))
  got = jax.jit(jax.grad(fast_loss, argnums=argnums))(*args)
  expected = jax.grad(reference_loss, argnums=argnums)(*args)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=atol)

"""A data x sequence mesh shape and the closeness the sequence-parallel tests hold results to."""

import numpy as np

DATA_2_SEQUENCE_4 = (2, 1, 1, 4)


def assert_close(actual, expected, rtol=1e-5):
  """Equal to `rtol` relative to the largest magnitude of `expected`."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert np.all(np.isfinite(actual))
  np.testing.assert_allclose(actual, expected, rtol=rtol,
                             atol=rtol * float(np.max(np.abs(expected))))

"""Exact comparison of two pytrees, leaf by leaf (the resume tests' bit-identity check)."""

import jax
import numpy as np


def assert_trees_equal(a, b) -> None:
  """Fails unless `a` and `b` have the same structure and bit-identical leaves."""
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                         a, b)

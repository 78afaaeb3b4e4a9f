"""The largest array a program makes (sub-programs included): how the tests hold a variant's
memory below the dense `[q, k]` scores."""

import jax
import numpy as np


def largest_intermediate(fn, *args) -> int:
  """Elements of the largest array any step of `fn`'s program (sub-programs included) makes."""
  def walk(jaxpr) -> int:
    biggest = 0
    for eqn in jaxpr.eqns:
      for var in eqn.outvars:
        biggest = max(biggest, int(np.prod(var.aval.shape)))
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            biggest = max(biggest, walk(sub.jaxpr))
          elif isinstance(sub, jax.extend.core.Jaxpr):
            biggest = max(biggest, walk(sub))
    return biggest
  return walk(jax.make_jaxpr(fn)(*args).jaxpr)

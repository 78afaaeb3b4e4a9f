"""Reversible residual layers with a custom VJP (Gomez et al., 2017; Kitaev et al., 2020, sec. 4).

A reversible layer maps a pair `(x1, x2)` to

  y1 = x1 + F(x2),    y2 = x2 + G(y1)                       (Reformer, eq. in sec. 4)

and its input is recovered from its output,

  x2 = y2 - G(y1),    x1 = y1 - F(x2).

`reversible_sequence` runs a stack of such layers forward and saves only the
final pair (plus the parameters and side inputs, which are alive anyway) for
the backward pass. The backward pass walks the layers from the top,
reconstructs each layer's input from its output and differentiates F and G
at the reconstructed point (`jax.vjp`), so activation memory is that of one
layer whatever the depth.

F and G are pure functions `(params, x, side) -> (h, extra)`:
  * `params`: any pytree, differentiated;
  * `x`: `[batch, length, d]`, the reconstructed stream;
  * `side`: any pytree of inputs that are not reconstructed (a layer's memory
    state, the attention context, dropout keys): passed to the backward pass
    as they are, so F and G must be deterministic functions of them (dropout
    keys make the recomputed masks equal to the forward ones);
  * `h`: `[batch, length, d]`, added to the stream;
  * `extra`: any pytree returned next to the stream (new memory state,
    auxiliary losses); its cotangent enters F's or G's VJP, so auxiliary
    losses train F's parameters.
Reconstruction is exact up to float rounding (`x + h - h`), so gradients
agree with an ordinary residual stack to rounding, not bit for bit.
"""

from typing import Callable, Sequence

import jax

ResidualFn = Callable  # (params, x, side) -> (h, extra)


def _forward_layers(fns, params, x1, x2, sides):
  extras = []
  for (f, g), (pf, pg), (sf, sg) in zip(fns, params, sides):
    hf, extra_f = f(pf, x2, sf)
    x1 = x1 + hf                    # y1 = x1 + F(x2)
    hg, extra_g = g(pg, x1, sg)
    x2 = x2 + hg                    # y2 = x2 + G(y1)
    extras.append((extra_f, extra_g))
  return x1, x2, tuple(extras)


def _backward_layer(f, g, pf, pg, sf, sg, y1, y2, dy1, dy2, d_extra_f, d_extra_g):
  """One layer's input and cotangents from its output and output cotangents."""
  (hg, _), g_vjp = jax.vjp(g, pg, y1, sg)
  x2 = y2 - hg
  dpg, dy1_via_g, dsg = g_vjp((dy2, d_extra_g))
  dy1 = dy1 + dy1_via_g            # y1 feeds y1's cotangent and G
  (hf, _), f_vjp = jax.vjp(f, pf, x2, sf)
  x1 = y1 - hf
  dpf, dx2_via_f, dsf = f_vjp((dy1, d_extra_f))
  dx2 = dy2 + dx2_via_f
  return x1, x2, dy1, dx2, (dpf, dpg), (dsf, dsg)


def reversible_sequence(fns: Sequence[tuple[ResidualFn, ResidualFn]], params, x1: jax.Array,
                        x2: jax.Array, sides):
  """Runs reversible layers with O(1)-in-depth activation memory for backward.

  Args:
    fns: one `(F, G)` pair of pure functions per layer (module docstring);
      static Python callables.
    params: one `(params_F, params_G)` pair per layer (a tuple).
    x1, x2: `[batch, length, d]` the two input streams.
    sides: one `(side_F, side_G)` pair per layer (a tuple).
  Returns:
    `(y1, y2, extras)` with `extras` one `(extra_F, extra_G)` pair per layer.
  """
  fns = tuple(fns)

  @jax.custom_vjp
  def run(params, x1, x2, sides):
    return _forward_layers(fns, params, x1, x2, sides)

  def run_fwd(params, x1, x2, sides):
    y1, y2, extras = _forward_layers(fns, params, x1, x2, sides)
    # Only the top of the stack is kept; params and sides are inputs anyway.
    return (y1, y2, extras), (params, sides, y1, y2)

  def run_bwd(residuals, cotangents):
    params, sides, y1, y2 = residuals
    dy1, dy2, d_extras = cotangents
    d_params, d_sides = [None] * len(fns), [None] * len(fns)
    for i in reversed(range(len(fns))):
      (f, g), (pf, pg), (sf, sg) = fns[i], params[i], sides[i]
      y1, y2, dy1, dy2, d_params[i], d_sides[i] = _backward_layer(
          f, g, pf, pg, sf, sg, y1, y2, dy1, dy2, *d_extras[i])
      # Ties the rebuilt inputs to this layer's cotangents: otherwise the
      # scheduler may rebuild all layers' inputs first (a chain of forward
      # computations) and keep every layer's VJP residuals alive.
      y1, y2, dy1, dy2 = jax.lax.optimization_barrier((y1, y2, dy1, dy2))
    return tuple(d_params), dy1, dy2, tuple(d_sides)

  run.defvjp(run_fwd, run_bwd)
  return run(tuple(params), x1, x2, tuple(sides))

"""Matmul FLOPs of a traced program, loops and rematerialisation included.

XLA's `cost_analysis()` counts the body of a while loop once, whatever its trip
count, so a model whose layers run under `lax.scan` (`model.scan_layers`) and whose
chunks are scanned by the chunk driver reports a fraction of its FLOPs. This walks
the program's jaxpr instead (`jax.make_jaxpr`): every `dot_general` counts
2 x (batch) x (lhs free) x (rhs free) x (contracted) FLOPs, a `scan` multiplies its
body by its length, a `cond` counts its costliest branch, a `shard_map` multiplies
its per-device body by the devices of its manual axes, and a rematerialised block
(`remat`) counts where the backward pass recomputes it, since the differentiated
jaxpr holds the recomputation explicitly. A `while` loop has no static trip count:
its body counts once and the loop is reported (`ProgramFlops.while_loops`), so a
caller knows the figure is then a lower bound.

Only matmuls count (the MFU convention: elementwise work, softmax and the optimizer
are not FLOPs of the MXU / tensor cores). The figure is global: the program before
partitioning, as one device would run it.
"""

import dataclasses
import math

import jax
from jax.extend import core as jax_core


@dataclasses.dataclass(frozen=True)
class ProgramFlops:
  """matmul_flops: the program's dot_general FLOPs, loops unrolled;
  while_loops: loops counted once (0 when the figure is exact)."""
  matmul_flops: float
  while_loops: int


def dot_general_flops(lhs_shape, rhs_shape, dimension_numbers) -> float:
  """2 x batch x lhs-free x rhs-free x contracted: one multiply and one add per term."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  del lhs_batch
  rhs_free = math.prod(size for axis, size in enumerate(rhs_shape)
                       if axis not in rhs_contract and axis not in rhs_batch)
  return 2.0 * math.prod(lhs_shape) * rhs_free


def _subprograms(value):
  """The jaxprs held by one equation parameter (a jaxpr, or a tuple of them)."""
  if isinstance(value, jax_core.ClosedJaxpr):
    return [value.jaxpr]
  if isinstance(value, jax_core.Jaxpr):
    return [value]
  if isinstance(value, (tuple, list)):
    return [p for item in value for p in _subprograms(item)]
  return []


def _manual_devices(params) -> int:
  """The devices a shard_map body runs on: the product of its manual mesh axes."""
  mesh = params['mesh']
  manual = params.get('manual_axes')
  if manual is None:                      # older JAX: every axis but the `auto` ones
    auto = params.get('auto', frozenset())
    manual = [name for name in mesh.axis_names if name not in auto]
  return math.prod(mesh.shape[name] for name in manual)


def _walk(jaxpr) -> tuple[float, int]:
  flops, loops = 0.0, 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == 'dot_general':
      flops += dot_general_flops(eqn.invars[0].aval.shape, eqn.invars[1].aval.shape,
                                 eqn.params['dimension_numbers'])
      continue
    if name == 'cond':
      parts = [_walk(branch) for branch in _subprograms(eqn.params['branches'])]
      flops += max(part[0] for part in parts)
      loops += sum(part[1] for part in parts)
      continue
    inner_flops, inner_loops = 0.0, 0
    for value in eqn.params.values():
      for sub in _subprograms(value):
        sub_flops, sub_loops = _walk(sub)
        inner_flops += sub_flops
        inner_loops += sub_loops
    if name == 'scan':
      inner_flops *= eqn.params['length']
    elif name == 'shard_map':
      inner_flops *= _manual_devices(eqn.params)
    elif name == 'while':
      loops += 1
    flops += inner_flops
    loops += inner_loops
  return flops, loops


def program_flops(fn, *args, **kwargs) -> ProgramFlops:
  """The matmul FLOPs of `fn(*args, **kwargs)` (abstract `jax.ShapeDtypeStruct`s do)."""
  closed = jax.make_jaxpr(fn)(*args, **kwargs)
  flops, loops = _walk(closed.jaxpr)
  return ProgramFlops(matmul_flops=flops, while_loops=loops)

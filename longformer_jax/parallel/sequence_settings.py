"""Whether, and how, the attention layers split a chunk over the `sequence` mesh axis.

Inside `sharding.activation_sharding(mesh, rules, parallel)` (the train step,
evaluation), a mesh whose `sequence` axis is larger than 1 makes the layers
that support it (the vanilla attention, with or without a cache;
Transformer-XL's relative attention with its memory; the Longformer's
cache-free window with or without global tokens; docs/scaling.md) attend
through `attention/sequence_parallel/attention.py` and its siblings with the method
and load balancing of `config.parallel` (`sequence_parallel`,
`load_balance`); everything else in the model is per token and follows the
`length` -> `sequence` sharding rule. Outside it (or with a sequence axis of
1) nothing changes.
"""

import contextlib
import contextvars
import dataclasses

import jax

SEQUENCE_AXIS = 'sequence'


@dataclasses.dataclass(frozen=True)
class SequenceSettings:
  method: str = 'ring'            # ring | all_gather
  load_balance: bool = True       # zigzag layout for causal attention


_CURRENT = contextvars.ContextVar('sequence_settings', default=SequenceSettings())


def current() -> SequenceSettings:
  return _CURRENT.get()


@contextlib.contextmanager
def using(settings: SequenceSettings):
  token = _CURRENT.set(settings)
  try:
    yield
  finally:
    _CURRENT.reset(token)


def sequence_axis_size() -> int:
  """The size of the `sequence` axis of the mesh in context (1 without one)."""
  return dict(jax.sharding.get_abstract_mesh().shape).get(SEQUENCE_AXIS, 1)

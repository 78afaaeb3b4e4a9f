"""Layer stack types by config name (`model.stack`).

A stack is `Stack(config, dtype, name='blocks')(x, states, ctx) ->
(x, states, aux_per_layer)` with a static `init_state(config, batch_size,
dtype)`; `states` and `aux_per_layer` are tuples with one entry per layer
(per application, for stacks that share a block).
"""

from longformer_jax.config.errors import ConfigError
from longformer_jax.models.attendre_delay import TimeShiftedStack
from longformer_jax.models.standard_stack import BlockStack
from longformer_jax.models.reversible_stack import ReversibleStack
from longformer_jax.models.universal_stack import UniversalTransformerACT

STACK_TYPES = {
    'reversible': ReversibleStack,
    'standard': BlockStack,
    'attendre_delay': TimeShiftedStack,
    'universal_act': UniversalTransformerACT,
}


def stack_class(name: str):
  if name not in STACK_TYPES:
    raise ConfigError('model.stack', f'unknown stack {name!r}; choose one of {sorted(STACK_TYPES)}')
  return STACK_TYPES[name]

"""Rematerialisation policies by config name (`model.remat_policy`).

Applied per block with `nn.remat`: the forward activations a policy does not
save are recomputed in the backward pass, trading FLOPs for memory.
"""

import jax

from longformer_jax.config.errors import ConfigError

REMAT_POLICIES = {
    'none': None,  # no remat: every activation is stored
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    'everything': jax.checkpoint_policies.everything_saveable,
}


def remat_policy(name: str):
  """The `jax.checkpoint_policies` policy for `name` (None means no remat)."""
  if name not in REMAT_POLICIES:
    raise ConfigError('model.remat_policy',
                      f'unknown remat policy {name!r}; choose one of {sorted(REMAT_POLICIES)}')
  return REMAT_POLICIES[name]

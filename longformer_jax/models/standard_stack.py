"""The standard stack of blocks: unrolled, or scanned over layers with `nn.scan`.

Memory is a tuple with one pytree per layer (leaves `[batch, ...]`), so
layers may carry different memories (e.g. a kNN memory in one layer only,
`model.layer_schedule`) and checkpoints of memory do not depend on
`scan_layers`. The scanned layout (identical layers only) stacks the
per-layer states on a leading axis for `nn.scan` and splits them after.
Parameters do depend on the layout: the scanned one stores each weight once
with a leading `layers` axis under `layers/`, the unrolled one under
`layer_0`, `layer_1`, ... (`longformer_jax.models.param_layout` converts).
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.attention.registry import attention_state
from longformer_jax.models.block_registry import block_class
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.parallel.remat import remat_policy

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


def layer_slice(stacked, i: int):
  """Layer i's entry of a pytree with a leading `[layers, ...]` axis."""
  return jax.tree_util.tree_map(lambda a: a[i], stacked)


def stack_layers(per_layer) -> object:
  """A sequence of identically shaped per-layer pytrees -> one `[layers, ...]` pytree."""
  return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_layer)


def unstack_layers(stacked, num_layers: int) -> tuple:
  """Inverse of `stack_layers`: a tuple of per-layer pytrees."""
  return tuple(layer_slice(stacked, i) for i in range(num_layers))


def layer_block(cfg, dtype, name: str):
  """The (optionally rematerialised) block class for layer config `cfg`."""
  cls = block_class(cfg.block)
  if cfg.remat_policy != 'none':
    cls = nn.remat(cls, policy=remat_policy(cfg.remat_policy), prevent_cse=not cfg.scan_layers)
  return cls


class BlockStack(nn.Module):
  """`(x [batch, chunk, d_model], states (per layer), ctx) -> (x, states, aux per layer)`."""
  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config, batch_size: int, dtype=jnp.float32) -> tuple:
    """Each layer's empty memory, from its own (scheduled) config."""
    return tuple(attention_state(layer_config(config, i), batch_size, dtype)
                 for i in range(config.num_layers))

  @nn.compact
  def __call__(self, x: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    if cfg.scan_layers:
      scanned = nn.scan(
          layer_block(cfg, self.dtype, 'layers'),
          variable_axes={'params': 0, MODEL_STATE: 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=(0, nn.broadcast),
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'})
      x, (stacked, aux) = scanned(cfg, self.dtype, name='layers')(x, stack_layers(states), ctx)
      return (x, unstack_layers(stacked, cfg.num_layers), unstack_layers(aux, cfg.num_layers))
    new_states, auxes = [], []
    for i in range(cfg.num_layers):
      layer_cfg = layer_config(cfg, i)
      block = layer_block(layer_cfg, self.dtype, f'layer_{i}')
      x, (state, aux) = block(layer_cfg, self.dtype, name=f'layer_{i}')(x, states[i], ctx)
      new_states.append(state)
      auxes.append(aux)
    return x, tuple(new_states), tuple(auxes)

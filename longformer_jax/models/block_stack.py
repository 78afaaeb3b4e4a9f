"""A stack of identical blocks: unrolled, or scanned over layers with `nn.scan`.

Memory states are stacked along a leading `layers` axis in both layouts, so
checkpoints of memory do not depend on `scan_layers`. Parameters do: the
scanned layout stores each weight once with a leading `layers` axis under
`layers/`, the unrolled one under `layer_0`, `layer_1`, ...
(`longformer_jax.models.param_layout` converts between them).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.context import AttentionContext
from longformer_jax.models.block import DecoderBlock
from longformer_jax.parallel.remat import remat_policy


def layer_slice(stacked, i: int):
  """Layer i's state out of a `[layers, ...]` stacked pytree."""
  return jax.tree_util.tree_map(lambda a: a[i], stacked)


def stack_layers(per_layer: list):
  """Inverse of `layer_slice` over all layers."""
  return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_layer)


class BlockStack(nn.Module):
  """`(x [batch, chunk, d_model], states [layers, ...], ctx) -> (x, states, aux)`."""
  config: ml_collections.FrozenConfigDict
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    block_cls = DecoderBlock
    policy = remat_policy(cfg.remat_policy)
    if cfg.remat_policy != 'none':
      block_cls = nn.remat(block_cls, policy=policy, prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      scanned = nn.scan(
          block_cls,
          variable_axes={'params': 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=(0, nn.broadcast),
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'})
      x, (states, aux) = scanned(cfg, self.dtype, name='layers')(x, states, ctx)
      return x, states, aux
    new_states, auxes = [], []
    for i in range(cfg.num_layers):
      x, (state, aux) = block_cls(cfg, self.dtype, name=f'layer_{i}')(x, layer_slice(states, i), ctx)
      new_states.append(state)
      auxes.append(aux)
    return x, stack_layers(new_states), stack_layers(auxes)

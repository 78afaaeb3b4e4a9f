"""Converts parameters between the unrolled and the layer-scanned stack layouts.

Unrolled: `blocks/layer_0/...`, `blocks/layer_1/...`; scanned (`nn.scan`):
`blocks/layers/...` with a leading `[num_layers]` axis on every leaf. Useful
to load a checkpoint into the other layout, and to test that both compute
the same function.
"""

import jax
import jax.numpy as jnp


def scan_layout(params: dict, num_layers: int) -> dict:
  """Unrolled -> scanned: stacks `layer_i` subtrees into `layers`."""
  blocks = dict(params['blocks'])
  per_layer = [blocks.pop(f'layer_{i}') for i in range(num_layers)]
  blocks['layers'] = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_layer)
  return dict(params, blocks=blocks)


def unrolled_layout(params: dict, num_layers: int) -> dict:
  """Scanned -> unrolled: slices the `layers` subtree into `layer_i`."""
  blocks = dict(params['blocks'])
  stacked = blocks.pop('layers')
  for i in range(num_layers):
    blocks[f'layer_{i}'] = jax.tree_util.tree_map(lambda a: a[i], stacked)
  return dict(params, blocks=blocks)

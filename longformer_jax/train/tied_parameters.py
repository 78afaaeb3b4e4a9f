"""Copies of one parameter in every layer kept equal: the gradient of a shared table.

T5 keeps one relative position table per side (encoder, decoder) and every layer adds its
bias from it; this project's T5 layers each hold a copy (attention/core/checkpoint_heads.py).
`tie_parameters(name)` goes first in the optimizer's chain: the leaves with a path
component `name` are grouped by their path with the layer numbers removed
(`encoder/blocks/layer_3/attention/relative_attention_bias/embedding` ->
`encoder/blocks/layer_*/...`; `decoder_1/...` -> `decoder_*/...`), and each leaf's gradient
becomes its group's sum, which is the gradient of one table that every layer reads.
Copies that start equal (an import writes them so) stay equal under clipping and AdamW: the
same gradient gives each the same moments, update and decay, so a fine-tuned T5 writes back
one table per side (convert/encoder_export.py).
"""

import re

import jax
import optax


def _path_names(path) -> tuple:
  return tuple(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


def tied_groups(tree, name: str) -> list[list[int]]:
  """Groups (indices into `tree`'s flattened leaves) of the leaves under `name` that differ
  only by layer numbers; a group of one (a single layer) is left out."""
  groups = {}
  for index, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0]):
    names = _path_names(path)
    if name in names:
      groups.setdefault(tuple(re.sub(r'\d+', '*', n) for n in names), []).append(index)
  return [members for members in groups.values() if len(members) > 1]


def tie_parameters(name: str) -> optax.GradientTransformation:
  """Each leaf under `name` gets the sum of the gradients of its layer copies."""

  def update(updates, state, params=None):
    del params
    leaves, structure = jax.tree_util.tree_flatten(updates)
    for members in tied_groups(updates, name):
      total = sum(leaves[i] for i in members)
      for i in members:
        leaves[i] = total
    return jax.tree_util.tree_unflatten(structure, leaves), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)

"""How a train state's layout maps onto what a checkpoint holds (checkpoint/checkpointer.py).

- Zero-size leaves (e.g. a memory of capacity 0) are saved as None: Orbax
  refuses to save them, and they hold no data; they are put back on restore.
- Fields of the train-state dataclass that hold no arrays and that an older
  checkpoint lacks (a field added after it was written, such as
  `TrainState.model_state`) are left out of the restore and put back as they
  are in the target, so older checkpoints still restore.
"""

import dataclasses
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

PyTree = Any


def without_empty_arrays(tree: PyTree) -> PyTree:
  """Zero-size leaves as None."""
  return jax.tree_util.tree_map(lambda x: None if x.size == 0 else x, tree)


def with_empty_arrays(restored: PyTree, abstract_state: PyTree) -> PyTree:
  """Puts back the zero-size leaves of `abstract_state` that were saved as None."""

  def fill(abstract, value):
    if abstract.size:
      return value
    sharding = getattr(abstract, 'sharding', None)
    return jax.device_put(jax.numpy.zeros(abstract.shape, abstract.dtype), sharding)
  return jax.tree_util.tree_map(fill, abstract_state, restored,
                                is_leaf=lambda x: x is None)


def target_like_saved(saved: Any, target: PyTree) -> tuple[PyTree, Callable]:
  """`(target, as_target)` for restoring into `target` what `saved` (the checkpoint's state
  metadata, keyed by field) holds: fields of a dataclass `target` with no arrays that
  `saved` lacks are left out; `as_target(restored)` puts them back."""
  unchanged = (target, lambda restored: restored)
  if not dataclasses.is_dataclass(target) or saved is None or not hasattr(saved, 'keys'):
    return unchanged
  fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(target)}
  if not set(saved.keys()) <= set(fields):
    return unchanged
  absent = {name: value for name, value in fields.items()
            if name not in saved.keys() and not jax.tree_util.tree_leaves(value)}
  if not absent:
    return unchanged
  kept = {name: value for name, value in fields.items() if name not in absent}
  return kept, lambda restored: dataclasses.replace(target, **restored, **absent)


def read_fields(state_directory: str, target: dict) -> dict:
  """The fields of `target` (a dict of some train-state fields, e.g. `params`) read from a
  saved state item, the other fields left unread (Orbax's partial restore)."""
  reader = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
  args = ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
      partial_restore=True)
  try:
    return reader.restore(state_directory, args=args)
  finally:
    reader.close()

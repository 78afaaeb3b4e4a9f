"""Reading one checkpoint step's items and checking them (checkpoint/checkpointer.py).

A step directory holds `state` (the train state), `data` (the data position) and
`checksums`; a parameters-only step (an import's) holds `params` and `data`
instead. `StepReader` reads what a restore asks for, checks shapes on the saved
metadata before any array is read, checks the arrays against their checksums,
and turns every failure into `CheckpointMismatchError` (other shapes: the
checkpoint is fine) or `CorruptCheckpointError` (resume_checks.py). It never
moves or writes anything; the `Checkpointer` decides what a failure means for
the run.
"""

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from longformer_jax.checkpoint import saved_layout
from longformer_jax.checkpoint.checksums import checksum_mismatches, state_checksums
from longformer_jax.checkpoint.resume_checks import (CorruptCheckpointError, first_line,
                                                     mismatch_error, read_error,
                                                     shape_differences)
from longformer_jax.checkpoint.safetensors_params import ParamsRestore

PyTree = Any

STATE = 'state'
PARAMS = 'params'        # a parameters-only checkpoint's (an import's) item instead of `state`
DATA = 'data'
CHECKSUMS = 'checksums'
# The fields of a train state that evaluation and generation read (`param_fields`).
PARAM_FIELDS = ('step', 'params', 'model_state')

_log = logging.getLogger(__name__)


class StepReader:
  """Reads the items of the steps an Orbax `CheckpointManager` keeps in `directory`."""

  def __init__(self, manager: ocp.CheckpointManager, directory: str):
    self._manager = manager
    self._directory = directory

  def step_directory(self, step: int) -> str:
    return os.path.join(self._directory, str(step))

  def state(self, step: int, abstract_state: PyTree) -> tuple[PyTree, dict]:
    """`(state, data_state)` of a whole-state step, in `abstract_state`'s layout."""
    target = saved_layout.without_empty_arrays(abstract_state)
    target, as_target = self._target_like_saved(step, target)
    self._check_shapes(step, target)
    restored = self._restore_items(step, STATE, target)
    state = as_target(restored[STATE])
    self._verify_checksums(step, state_checksums(state), restored[CHECKSUMS])
    return saved_layout.with_empty_arrays(state, abstract_state), restored[DATA]

  def params_item(self, step: int, abstract_params: PyTree) -> tuple[PyTree, dict]:
    """`(params, data_state)` of a parameters-only step, each tensor checked against its
    CRC-32 and cast to `abstract_params`' dtype and sharding."""
    target = saved_layout.without_empty_arrays(abstract_params)
    restored = self._restore_items(step, PARAMS, target, checksums=False)
    params = saved_layout.with_empty_arrays(restored[PARAMS], abstract_params)
    return params, restored[DATA]

  def param_fields(self, step: int, abstract_state: PyTree) -> tuple[PyTree, PyTree, int]:
    """`(params, model_state, step)` of a whole-state step, the other fields (optimizer
    state, memory, rng) left unread; checked against the state's checksums."""
    fields = {name: getattr(abstract_state, name) for name in PARAM_FIELDS
              if jax.tree_util.tree_leaves(getattr(abstract_state, name))}
    target = saved_layout.without_empty_arrays(fields)
    self._check_shapes(step, target, only=tuple(fields))
    try:
      restored = saved_layout.read_fields(os.path.join(self.step_directory(step), STATE),
                                          target)
    except Exception as error:  # Orbax/TensorStore raise many error types.
      raise self._read_error(step, error) from error
    computed = {}
    for name, value in restored.items():
      computed.update(state_checksums(value, prefix=f'.{name}'))
    self._verify_checksums(step, computed, self._restore_items(step, None, None)[CHECKSUMS])
    restored = saved_layout.with_empty_arrays(restored, fields)
    model_state = (restored['model_state'] if 'model_state' in restored
                   else abstract_state.model_state)   # no leaves: nothing was read
    return restored['params'], model_state, int(restored['step'])

  def _saved_metadata(self, step: int) -> Any:
    """The saved state's tree (leaves with shapes and dtypes), or None where unreadable
    (the restore then reports why)."""
    try:
      return self._manager.item_metadata(step)[STATE]
    except Exception as error:  # Unreadable metadata: the restore reports it.
      _log.debug('No metadata for step %d: %s', step, first_line(error))
      return None

  def _target_like_saved(self, step: int, target: PyTree):
    """`saved_layout.target_like_saved` against this step's saved metadata."""
    saved = self._saved_metadata(step)
    if saved is None:
      return target, lambda restored: restored
    return saved_layout.target_like_saved(saved, target)

  def _check_shapes(self, step: int, target: PyTree, only: tuple = ()) -> None:
    """Raises `CheckpointMismatchError` if leaves of `target` have other shapes than saved
    (`only`: compare these top-level fields of the saved state alone); checked on the
    metadata, before reading any array."""
    saved = self._saved_metadata(step)
    if saved is None:
      return
    if only and hasattr(saved, 'keys'):
      saved = {name: saved[name] for name in only if name in saved}
    differences = shape_differences(saved, target)
    if differences:
      raise mismatch_error(step, self._directory, differences)

  def _restore_items(self, step: int, item: str | None, target: PyTree,
                     checksums: bool = True) -> dict:
    """Reads `item` (`STATE` or `PARAMS` into `target`; None: no arrays), the data
    position and (unless `checksums` is False: a parameters-only checkpoint keeps its
    own) the checksums of `step`, turning any failure into a clear error."""
    items = {DATA: ocp.args.JsonRestore()}
    if checksums:
      items[CHECKSUMS] = ocp.args.JsonRestore()
    if item == STATE:
      items[item] = ocp.args.StandardRestore(target)
    elif item == PARAMS:
      items[item] = ParamsRestore(target)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:  # Orbax/TensorStore raise many error types.
      raise self._read_error(step, error) from error
    items = {name: restored.get(name) for name in items}
    missing = [name for name, value in items.items() if value is None]
    if missing:
      raise CorruptCheckpointError(
          f'Checkpoint directory {self.step_directory(step)} (step {step})'
          f' lacks the items {missing}; it is corrupt or truncated.')
    return items

  def _read_error(self, step: int, error: Exception) -> Exception:
    """The error to raise for a failed read (`resume_checks.read_error`)."""
    return read_error(step, self._directory, self.step_directory(step), error)

  def _verify_checksums(self, step: int, restored: dict[str, dict],
                        saved: dict[str, dict]) -> None:
    """Raises `CorruptCheckpointError` unless `restored` (`state_checksums` of what was
    read) matches `saved` (`checksums.checksum_mismatches`)."""
    bad = checksum_mismatches(restored, saved)
    if bad:
      raise CorruptCheckpointError(
          f'Checkpoint directory {self.step_directory(step)} (step {step})'
          f' is corrupt: the restored arrays {bad} differ from the checksums'
          ' written when it was saved.')

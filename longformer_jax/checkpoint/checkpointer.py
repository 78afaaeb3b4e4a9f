"""Saving and restoring a training run with Orbax.

`Checkpointer` wraps `orbax.checkpoint.CheckpointManager` for the checkpoints
of one run in `workdir/checkpoints/<step>/`. Each step directory holds three
items:

  * `state`: the train-state pytree (`ocp.args.StandardSave`); sharded arrays,
    typed or raw PRNG keys and flax struct dataclasses are all fine;
  * `data`: the data-pipeline position, a JSON dict (`ocp.args.JsonSave`);
  * `checksums`: one checksum per array of `state`, a JSON dict.

Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it when it
is complete (in a `gs://` workdir, which has no rename, it writes
`<step>/commit_success.txt` last), so a step left by a killed process is never
listed as a checkpoint. Orbax (TensorStore) notices a missing or truncated file, but a
flipped bit inside a chunk of array data is restored silently; the checksums
catch that, so a resumed run is either bit-identical to the saved one or fails
with `CorruptCheckpointError`. Nothing here ever deletes or rewrites an
existing checkpoint, except the pruning of old steps that `keep` asks for.

Resuming (`Checkpointer.restore_latest_intact`) tries the newest step first.
A step that is corrupt (a missing or truncated file, a missing item, a flipped
bit) is renamed to `checkpoints/<step>.corrupt` (never deleted), one warning
line says so, and the next older step is tried. A train state of other shapes
than the saved one (another architecture or batch size) is not corruption:
it raises `CheckpointMismatchError` and nothing is moved.

A parameters-only checkpoint (an import's, `save_params`) holds `params` (one
safetensors file, checkpoint/safetensors_params.py) and `data` instead;
`restore_params` reads the parameters of either kind without the optimizer state.
`orbax_noise` hides the tracebacks a failed Orbax read leaves behind; `array_writes` has a
one-process run write each replicated array whole.
"""

import itertools
import logging
import os
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from longformer_jax.checkpoint import orbax_noise, saved_layout
from longformer_jax.checkpoint.array_writes import use_whole_array_writes
from longformer_jax.checkpoint.checksums import state_checksums
from longformer_jax.checkpoint.resume_checks import (  # the errors, re-exported here
    CheckpointMismatchError, CheckpointNotFoundError, CorruptCheckpointError,
    NoIntactCheckpointError)
from longformer_jax.checkpoint.safetensors_params import ParamsSave, SafetensorsParamsHandler
from longformer_jax.checkpoint.step_reader import CHECKSUMS, DATA, PARAMS, STATE, StepReader
from longformer_jax.storage import paths

PyTree = Any

_CORRUPT_SUFFIX = '.corrupt'

_log = logging.getLogger(__name__)


class Checkpointer:
  """Saves and restores `(state, data_state)` under `workdir/checkpoints`.

  All processes of a multi-host run must create the `Checkpointer` and call
  `save`/`restore` together (Orbax synchronizes them and writes each shard
  from the process that holds it). This object must be the only writer of
  its directory.
  """

  def __init__(self, workdir: str, keep: int, async_save: bool = True,
               remove_unfinished: bool = False):
    """`remove_unfinished`: delete the steps earlier saves left unfinished (a local
    `<step>.orbax-checkpoint-tmp*` folder, a `gs://` step without `commit_success.txt`),
    so that a full disk gets their space back. Only the run that holds the workdir's lease
    may: another process's save in flight looks the same."""
    if keep < 1:
      raise ValueError(f'keep must be >= 1 checkpoints, got {keep}.')
    orbax_noise.install()
    use_whole_array_writes()
    self._directory = os.fspath(paths.as_path(workdir) / 'checkpoints')
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
        enable_async_checkpointing=async_save,
        create=True,
        cleanup_tmp_directories=remove_unfinished,
    )
    handlers = {
        STATE: ocp.StandardCheckpointHandler(),
        PARAMS: SafetensorsParamsHandler(),
        DATA: ocp.JsonCheckpointHandler(),
        CHECKSUMS: ocp.JsonCheckpointHandler(),
    }
    self._manager = ocp.CheckpointManager(
        self._directory, item_handlers=handlers, options=options
    )
    self._reader = StepReader(self._manager, self._directory)
    self.async_save = async_save
    self._closed = False
    self._barriers = itertools.count()

  @property
  def directory(self) -> str:
    """The directory that holds one sub-directory per saved step."""
    return self._directory

  def all_steps(self) -> list[int]:
    """Steps of all finished (or in-flight) checkpoints, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest checkpointed step, or None when there is none."""
    return self._manager.latest_step()

  def save(
      self,
      step: int,
      state: PyTree,
      data_state: dict,
      *,
      force: bool = False,
  ) -> bool:
    """Starts saving `state` and `data_state` as checkpoint `step`.

    The caller decides the cadence: any step newer than the latest one is
    saved. With `async_save` this returns once the arrays are copied off the
    accelerator (the caller may then donate or overwrite them) and the files
    are written in the background; a previous in-flight save is awaited
    first.

    Args:
      step: the training step the state belongs to.
      state: pytree of jax arrays.
      data_state: JSON-serializable dict (the data-pipeline position).
      force: also save a step older than the latest checkpoint.

    Returns:
      True when a save was started; False when `step` is already saved (or,
      without `force`, is not newer than the latest step).
    """
    step = int(step)
    if step in self._manager.all_steps():
      # Routine: the loop saves at its end also when that step was just
      # saved (or a resumed run has nothing left to do), so no message.
      _log.debug('Checkpoint for step %d already exists; not saving.', step)
      return False
    if not force and not self._manager.should_save(step):
      _log.info('Not saving step %d: not newer than the latest.', step)
      return False
    state = saved_layout.without_empty_arrays(state)
    args = ocp.args.Composite(
        **{
            STATE: ocp.args.StandardSave(state),
            DATA: ocp.args.JsonSave(data_state),
            CHECKSUMS: ocp.args.JsonSave(state_checksums(state)),
        }
    )
    saved = self._manager.save(step, args=args, force=force)
    if saved:
      _log.info('Saving checkpoint for step %d in %s.', step, self._directory)
    return saved

  def restore(
      self, step: int | None, abstract_state: PyTree
  ) -> tuple[PyTree, dict]:
    """Restores checkpoint `step` (the latest when None).

    Args:
      step: the step to restore, or None for the latest one.
      abstract_state: pytree of `jax.ShapeDtypeStruct` (with `.sharding`) or
        arrays giving the structure, shapes, dtypes and shardings to restore
        into.

    Returns:
      `(state, data_state)` as they were saved.

    Raises:
      CheckpointNotFoundError: there is no checkpoint for `step`.
      CheckpointMismatchError: `abstract_state` has other shapes or another
        structure than the saved state (other shape-changing settings).
      CorruptCheckpointError: the checkpoint cannot be read or its arrays do
        not match the checksums written with it. Nothing is moved or changed.
    """
    self.wait()
    orbax_noise.install()  # Again, in case something replaced the filters.
    step = self._existing_step(step)
    if self.holds_params_only(step):
      raise CheckpointMismatchError(
          f'Checkpoint step {step} in {self._directory} holds parameters only (an import):'
          ' no train state to restore; restore_params reads it.')
    return self._reader.state(step, abstract_state)

  def restore_latest_intact(
      self, abstract_state: PyTree, from_params: Callable | None = None
  ) -> tuple[PyTree, dict, int]:
    """Restores the newest checkpoint that is intact, moving broken ones aside.

    Steps are tried newest first. A corrupt step (see `restore`) is renamed
    to `checkpoints/<step>.corrupt` (`.corrupt-1`, ... if taken; never
    deleted, and no longer listed as a checkpoint), one warning line names
    it and the cause, and the next older step is tried. Call it only when
    `latest_step()` is not None.

    Args:
      abstract_state: as for `restore`.
      from_params: builds the state from a parameters-only checkpoint's
        parameters (`save_params`), restored into `abstract_state.params`'
        dtypes and shardings; None refuses such a checkpoint.

    Returns:
      `(state, data_state, step)` of the newest intact checkpoint.

    Raises:
      CheckpointNotFoundError: there are no checkpoints at all.
      CheckpointMismatchError: as for `restore` (nothing is moved: the
        checkpoint is fine, the run's settings differ).
      NoIntactCheckpointError: every checkpoint was corrupt; all have been
        moved aside and the message says how to go on.
    """
    self.wait()
    self._existing_step(None)  # Raises CheckpointNotFoundError if none.
    moved = []
    for step in reversed(self.all_steps()):
      try:
        if self.holds_params_only(step):
          if from_params is None:
            raise CheckpointMismatchError(
                f'Checkpoint step {step} in {self._directory} holds parameters only'
                ' (an import); this run cannot start from it.')
          params, data_state = self._reader.params_item(step, abstract_state.params)
          return from_params(params), data_state, step
        state, data_state = self.restore(step, abstract_state)
        return state, data_state, step
      except CorruptCheckpointError as error:
        moved.append(self._move_aside(step))
        _log.warning('%s Moved it aside to %s; trying an older checkpoint.',
                     error, moved[-1])
    names = ', '.join(os.path.basename(path) for path in moved)
    raise NoIntactCheckpointError(
        f'No intact checkpoint to resume from in {self._directory}: all'
        f' {len(moved)} were corrupt and have been moved aside ({names}; kept'
        ' for inspection, no longer listed). Run the same command again to'
        ' start this workdir from step 0, or use a new --workdir.'
    )

  def save_params(self, step: int, params: PyTree, data_state: dict) -> bool:
    """Saves a parameters-only checkpoint `step` (an import): `params` (numpy arrays in
    their own dtypes, e.g. a checkpoint's bfloat16) written tensor by tensor as one
    safetensors file with their CRC-32s (checkpoint/safetensors_params.py), and
    `data_state`; no optimizer state, memory or rng. `restore_params` reads it, and
    `restore_latest_intact` with `from_params` (train.py's first start from it)."""
    args = ocp.args.Composite(**{PARAMS: ParamsSave(params),
                                 DATA: ocp.args.JsonSave(data_state)})
    return self._manager.save(int(step), args=args, force=True)

  def holds_params_only(self, step: int) -> bool:
    """Whether checkpoint `step` was written by `save_params`."""
    return (paths.as_path(self._step_directory(step)) / PARAMS).exists()

  def restore_params(self, step: int | None,
                     abstract_state: PyTree) -> tuple[PyTree, PyTree, int]:
    """`(params, model_state, step)` of checkpoint `step` (the latest when None), in
    `abstract_state`'s dtypes and shardings, reading neither the optimizer state nor the
    memory (what evaluation and generation need; a whole state's moments are twice the
    parameters). A parameters-only checkpoint's arrays are cast from their stored dtype
    after their checksums are checked. Raises as `restore` does; nothing is moved."""
    self.wait()
    orbax_noise.install()
    step = self._existing_step(step)
    if self.holds_params_only(step):
      if jax.tree_util.tree_leaves(abstract_state.model_state):
        raise CheckpointMismatchError(
            f'Checkpoint step {step} in {self._directory} holds parameters only; this model'
            ' also needs its non-gradient state (model_state).')
      params, _ = self._reader.params_item(step, abstract_state.params)
      return params, abstract_state.model_state, step
    return self._reader.param_fields(step, abstract_state)

  def wait(self) -> None:
    """Blocks until in-flight saves are written; raises their errors."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for in-flight saves and releases Orbax resources."""
    if not self._closed:
      self._closed = True
      self._manager.close()

  def __enter__(self) -> 'Checkpointer':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _step_directory(self, step: int) -> str:
    return self._reader.step_directory(step)

  def _existing_step(self, step: int | None) -> int:
    """Returns `step` (or the latest step), checking that it exists."""
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise CheckpointNotFoundError(
            f'No checkpoints to restore in {self._directory}.'
        )
      return steps[-1]
    step = int(step)
    if step not in steps:
      raise CheckpointNotFoundError(
          f'No checkpoint for step {step} in {self._directory}; available'
          f' steps: {steps}.'
      )
    return step

  def _move_aside(self, step: int) -> str:
    """Renames the directory of `step` to a free `<step>.corrupt[-N]` name."""
    source = self._step_directory(step)
    for n in itertools.count():
      target = source + _CORRUPT_SUFFIX + (f'-{n}' if n else '')
      if not paths.as_path(target).exists():
        break
    if jax.process_index() == 0:
      paths.move_aside(source, target)
    if jax.process_count() > 1:
      ocp.multihost.sync_global_processes(
          f'longformer_jax_move_aside_{step}_{next(self._barriers)}')
    self._manager.reload()
    return target

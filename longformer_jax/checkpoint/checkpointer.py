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

A failed Orbax read leaves TensorStore callbacks and futures behind that
Python reports, one traceback each: hundreds of lines that bury the one-line
cause. `orbax_noise` filters exactly these reports; a `Checkpointer` installs
it when it is created, before any read.
"""

import itertools
import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from longformer_jax.checkpoint import orbax_noise, saved_layout
from longformer_jax.checkpoint.checksums import state_checksums
from longformer_jax.checkpoint.resume_checks import CheckpointMismatchError
from longformer_jax.checkpoint.resume_checks import mismatch_error
from longformer_jax.checkpoint.resume_checks import orbax_mismatch_summary
from longformer_jax.checkpoint.resume_checks import shape_differences
from longformer_jax.storage import paths

PyTree = Any

_STATE = 'state'
_DATA = 'data'
_CHECKSUMS = 'checksums'
_ITEM_NAMES = (_STATE, _DATA, _CHECKSUMS)
_CORRUPT_SUFFIX = '.corrupt'

_log = logging.getLogger(__name__)


class CheckpointNotFoundError(FileNotFoundError):
  """The requested checkpoint step does not exist."""


class CorruptCheckpointError(RuntimeError):
  """A checkpoint exists but cannot be restored exactly as it was saved."""


class NoIntactCheckpointError(CorruptCheckpointError):
  """Every checkpoint of the run was corrupt; all were moved aside."""


class Checkpointer:
  """Saves and restores `(state, data_state)` under `workdir/checkpoints`.

  All processes of a multi-host run must create the `Checkpointer` and call
  `save`/`restore` together (Orbax synchronizes them and writes each shard
  from the process that holds it). This object must be the only writer of
  its directory.
  """

  def __init__(self, workdir: str, keep: int, async_save: bool = True):
    if keep < 1:
      raise ValueError(f'keep must be >= 1 checkpoints, got {keep}.')
    orbax_noise.install()
    self._directory = os.fspath(paths.as_path(workdir) / 'checkpoints')
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
        enable_async_checkpointing=async_save,
        create=True,
    )
    handlers = {
        _STATE: ocp.StandardCheckpointHandler(),
        _DATA: ocp.JsonCheckpointHandler(),
        _CHECKSUMS: ocp.JsonCheckpointHandler(),
    }
    self._manager = ocp.CheckpointManager(
        self._directory, item_handlers=handlers, options=options
    )
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
            _STATE: ocp.args.StandardSave(state),
            _DATA: ocp.args.JsonSave(data_state),
            _CHECKSUMS: ocp.args.JsonSave(state_checksums(state)),
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
    target = saved_layout.without_empty_arrays(abstract_state)
    target, as_target = self._target_like_saved(step, target)
    self._check_shapes(step, target)
    restored = self._restore_items(step, target)
    state = as_target(restored[_STATE])
    self._verify_checksums(step, state, restored[_CHECKSUMS])
    return saved_layout.with_empty_arrays(state, abstract_state), restored[_DATA]

  def restore_latest_intact(
      self, abstract_state: PyTree
  ) -> tuple[PyTree, dict, int]:
    """Restores the newest checkpoint that is intact, moving broken ones aside.

    Steps are tried newest first. A corrupt step (see `restore`) is renamed
    to `checkpoints/<step>.corrupt` (`.corrupt-1`, ... if taken; never
    deleted, and no longer listed as a checkpoint), one warning line names
    it and the cause, and the next older step is tried. Call it only when
    `latest_step()` is not None.

    Args:
      abstract_state: as for `restore`.

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
    return os.path.join(self._directory, str(step))

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

  def _target_like_saved(self, step: int, target: PyTree):
    """`saved_layout.target_like_saved` against this step's saved metadata."""
    try:
      saved = self._manager.item_metadata(step)[_STATE]
    except Exception:  # Unreadable metadata: the restore reports it.
      return target, lambda restored: restored
    return saved_layout.target_like_saved(saved, target)

  def _check_shapes(self, step: int, target: PyTree) -> None:
    """Raises `CheckpointMismatchError` if leaves of `target` have other
    shapes than saved; checked on the metadata, before reading any array."""
    try:
      saved = self._manager.item_metadata(step)[_STATE]
    except Exception as error:  # Unreadable metadata: the restore reports it.
      _log.debug('No metadata for step %d: %s', step, _first_line(error))
      return
    differences = [] if saved is None else shape_differences(saved, target)
    if differences:
      raise mismatch_error(step, self._directory, differences)

  def _restore_items(self, step: int, abstract_state: PyTree) -> dict:
    """Reads all items of `step`, turning any failure into a clear error."""
    args = ocp.args.Composite(
        **{
            _STATE: ocp.args.StandardRestore(abstract_state),
            _DATA: ocp.args.JsonRestore(),
            _CHECKSUMS: ocp.args.JsonRestore(),
        }
    )
    try:
      restored = self._manager.restore(step, args=args)
    except Exception as error:  # Orbax/TensorStore raise many error types.
      summary = orbax_mismatch_summary(error)
      if summary:
        raise mismatch_error(step, self._directory, [summary]) from error
      raise CorruptCheckpointError(
          f'Checkpoint step {step} ({self._step_directory(step)}) is corrupt'
          f' or truncated: {type(error).__name__}: {_first_line(error)}'
      ) from error
    items = {name: restored.get(name) for name in _ITEM_NAMES}
    missing = [name for name, item in items.items() if item is None]
    if missing:
      raise CorruptCheckpointError(
          f'Checkpoint directory {self._step_directory(step)} (step {step})'
          f' lacks the items {missing}; it is corrupt or truncated.'
      )
    return items

  def _verify_checksums(
      self, step: int, state: PyTree, saved: dict[str, dict]
  ) -> None:
    """Raises `CorruptCheckpointError` unless `state` matches `saved`.

    Arrays restored into another dtype or shape than they were saved with (a
    deliberate conversion) cannot match their checksum and are skipped.
    """
    restored = state_checksums(state)
    bad = [
        path
        for path, record in restored.items()
        if _comparable(record, saved.get(path)) and record != saved[path]
    ]
    bad += sorted(set(restored) - set(saved))
    if bad:
      raise CorruptCheckpointError(
          f'Checkpoint directory {self._step_directory(step)} (step {step})'
          f' is corrupt: the restored arrays {bad} differ from the checksums'
          ' written when it was saved.'
      )


def _comparable(restored: dict, saved: dict | None) -> bool:
  """Whether a restored leaf has the dtype and shape it was saved with."""
  return saved is not None and all(
      restored[key] == saved[key] for key in ('dtype', 'shape'))


def _first_line(error: BaseException, max_chars: int = 300) -> str:
  """A short summary of `error` (the full one stays chained as __cause__)."""
  lines = str(error).strip().splitlines()
  line = lines[0] if lines else ''
  return line if len(line) <= max_chars else line[:max_chars] + '...'

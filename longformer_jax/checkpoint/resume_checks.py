"""Can this workdir's checkpoint be resumed with the current settings?

A run resumed with another architecture or batch size cannot restore its
train state: the arrays have other shapes. Two checks say so plainly instead
of reporting a corrupt checkpoint:

  * `check_resumable` compares the settings that change the shapes of the
    train state (`SHAPE_KEYS`) in the workdir's `config.json` with the current
    ones before anything is restored, and raises a `ConfigError` naming the
    settings, their saved and their new values;
  * `shape_differences` compares the saved state's metadata with the restore
    target leaf by leaf; the `Checkpointer` raises `CheckpointMismatchError`
    (built by `mismatch_error`) from it, or from Orbax's own refusal of the
    target (`orbax_mismatch_summary`).
"""

import json
from typing import Any, Callable, Mapping

import jax

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths
from longformer_jax.storage.storage_errors import StorageError, cause, is_transient

PyTree = Any

# Dotted config keys (or, ending in '.', key prefixes) whose values change
# the shapes of the train state: parameters, optimizer state, memories.
SHAPE_KEYS = (
    'model.',
    'data.batch_size',
    'data.chunk_len',
    'data.tokenizer',
    'data.sentencepiece_model',
    'optimizer.grad_accum_steps',
)
MAX_LISTED = 3


class CheckpointMismatchError(ValueError):
  """The restore target has other shapes or structure than the checkpoint.

  The checkpoint is intact; the run was started with other shape-changing
  settings (architecture, batch size, ...) than the ones it was saved with.
  """


def config_differences(saved: Mapping, current: Mapping) -> list[str]:
  """Dotted keys of `SHAPE_KEYS` whose values differ, sorted.

  Values are compared after a JSON round trip (a tuple equals the list with
  the same items; values JSON cannot hold compare as their `str`). Only keys
  present in both configs are compared: an older run's `config.json` lacks
  settings added since, which take their defaults. Pass both configs in the
  same layout (migrate an old run's flat keys first).

  Args:
    saved: the config of the saved run, as nested dicts (its `config.json`).
    current: the current config as nested dicts (`config.to_dict()`).

  Returns:
    The differing keys, e.g. `['data.batch_size', 'model.d_model']`.
  """
  saved_values = _shape_values(saved)
  current_values = _shape_values(current)
  return sorted(key for key in saved_values.keys() & current_values.keys()
                if saved_values[key] != current_values[key])


def check_resumable(
    workdir: str,
    current_config: Mapping,
    migrate: Callable[[dict], dict] | None = None,
) -> None:
  """Raises `ConfigError` if `workdir` was trained with other shape settings.

  Call it before restoring a checkpoint of `workdir` and before the run
  writes its own `config.json` there. Does nothing if `workdir/config.json`
  does not exist.

  Args:
    workdir: the run's directory, holding the saved run's `config.json`.
    current_config: the current config as nested dicts.
    migrate: optional map from the saved config to today's layout (for the
      `config.json` of runs made before a config change).

  Raises:
    ConfigError: keyed by the first differing setting; its one-line message
      lists up to `MAX_LISTED` settings with their saved and new values and
      says to use a new workdir or the saved settings.
  """
  path = paths.as_path(workdir) / 'config.json'
  if not path.exists():
    return
  saved = json.loads(path.read_text(encoding='utf-8'))
  if migrate is not None:
    saved = migrate(saved)
  differences = config_differences(saved, current_config)
  if not differences:
    return
  saved_values, current_values = _shape_values(saved), _shape_values(current_config)
  listed = '; '.join(f'{key}: saved {saved_values[key]}, now {current_values[key]}'
                     for key in differences[:MAX_LISTED])
  raise ConfigError(
      differences[0],
      f'cannot resume {workdir}: its checkpoints were trained with other '
      f'shape-changing settings ({listed}{_more(differences)}). Use a new '
      f'--workdir, or resume with the saved settings in {path}')


def shape_differences(saved: PyTree, target: PyTree) -> list[str]:
  """Leaves whose shapes differ or that only one tree has, one line each.

  Leaves are matched by their path of key names (a dict key, a dataclass or
  named-tuple field and a sequence index all count alike), so Orbax's
  metadata tree (nested dicts) matches the train state it was saved from.
  A typed PRNG key is compared by the shape of its key data; dtypes are not
  compared (restoring into another dtype is a deliberate conversion).

  Args:
    saved: the saved state's metadata tree (leaves with a `.shape`; None
      leaves, e.g. zero-size arrays saved as None, are skipped).
    target: the restore target (arrays or `jax.ShapeDtypeStruct`s).

  Returns:
    Lines such as `params/dense/kernel: saved (64, 64), now (32, 64)`,
    `params/extra: not saved, now (3,)` or `memory/keys: saved (2, 8), not
    in this run`.
  """
  saved_shapes = _leaf_shapes(saved)
  target_shapes = _leaf_shapes(target)
  lines = []
  for path in sorted(saved_shapes.keys() | target_shapes.keys()):
    before = saved_shapes.get(path, 'not saved')
    after = target_shapes.get(path, 'not in this run')
    if before != after:
      prefix = 'saved ' if path in saved_shapes else ''
      suffix = 'now ' if path in target_shapes else ''
      lines.append(f'{path}: {prefix}{before}, {suffix}{after}')
  return lines


def orbax_mismatch_summary(error: BaseException) -> str | None:
  """One line summing up Orbax's refusal of a restore target, else None.

  Orbax raises a `ValueError` when the target's tree structure or an array
  shape differs from the saved one; any other error is not a mismatch.
  """
  text = str(error)
  if not isinstance(error, ValueError) or not (
      'tree structures do not match' in text
      or 'Structure mismatch' in text
      or 'not compatible with the stored shape' in text):
    return None
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  summary = ' '.join(lines[:1 + MAX_LISTED])
  return summary if len(summary) <= 300 else summary[:300] + '...'


def mismatch_error(step: int, directory: str,
                   differences: list[str]) -> CheckpointMismatchError:
  """The short error for a checkpoint that does not fit the restore target."""
  listed = '; '.join(differences[:MAX_LISTED]) + _more(differences)
  return CheckpointMismatchError(
      f'Checkpoint step {step} in {directory} holds a train state of other '
      f'shapes than this run builds: {listed}. The checkpoint is intact; '
      "resume with the settings it was trained with (the workdir's "
      'config.json) or use a new --workdir.')


def _more(items: list) -> str:
  return f' and {len(items) - MAX_LISTED} more' if len(items) > MAX_LISTED else ''


def _shape_values(config: Mapping) -> dict[str, str]:
  """`{dotted key: JSON text of its value}` for the `SHAPE_KEYS` of `config`."""
  plain = json.loads(json.dumps(config, default=str))
  flat = {}

  def walk(prefix: str, value: Any) -> None:
    if isinstance(value, dict) and value:
      for key, item in value.items():
        walk(f'{prefix}.{key}' if prefix else str(key), item)
    else:
      flat[prefix] = value

  walk('', plain)
  return {key: json.dumps(value, sort_keys=True) for key, value in flat.items()
          if any(key == k or (k.endswith('.') and key.startswith(k)) for k in SHAPE_KEYS)}


def _path_name(path: tuple) -> str:
  parts = []
  for entry in path:
    for attribute in ('key', 'name', 'idx'):
      if hasattr(entry, attribute):
        parts.append(str(getattr(entry, attribute)))
        break
    else:
      parts.append(str(entry))
  return '/'.join(parts)


def _leaf_shape(leaf: Any) -> tuple[int, ...]:
  dtype = getattr(leaf, 'dtype', None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return tuple(jax.eval_shape(jax.random.key_data,
                                jax.ShapeDtypeStruct(leaf.shape, dtype)).shape)
  return tuple(leaf.shape)


def _leaf_shapes(tree: PyTree) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {_path_name(path): _leaf_shape(leaf) for path, leaf in leaves
          if hasattr(leaf, 'shape')}


class CheckpointNotFoundError(FileNotFoundError):
  """The requested checkpoint step does not exist."""


class CorruptCheckpointError(RuntimeError):
  """A checkpoint exists but cannot be restored exactly as it was saved."""


class NoIntactCheckpointError(CorruptCheckpointError):
  """Every checkpoint of the run was corrupt; all were moved aside."""


def first_line(error: BaseException, max_chars: int = 300) -> str:
  """A short summary of `error` (the full one stays chained as __cause__)."""
  lines = str(error).strip().splitlines()
  line = lines[0] if lines else ''
  return line if len(line) <= max_chars else line[:max_chars] + '...'


def read_error(step: int, directory: str, step_directory: str,
               error: Exception) -> Exception:
  """The error to raise for a failed read of checkpoint `step`: a storage that failed
  for a while (`StorageError`: the step may be fine, so it is never moved aside), a
  mismatch of shapes (`CheckpointMismatchError`, or Orbax's refusal of the target), else
  corruption."""
  if is_transient(error):
    return StorageError(f'reading checkpoint {step} in {step_directory} failed: '
                        f'{cause(error)}')
  summary = (str(error) if isinstance(error, CheckpointMismatchError)
             else orbax_mismatch_summary(error))
  if summary:
    return mismatch_error(step, directory, [summary])
  return CorruptCheckpointError(
      f'Checkpoint step {step} ({step_directory}) is corrupt'
      f' or truncated: {type(error).__name__}: {first_line(error)}')

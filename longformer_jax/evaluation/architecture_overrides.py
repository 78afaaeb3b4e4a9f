"""Command-line settings eval.py refuses, instead of ignoring them.

eval.py builds the model and data from the run's `config.json`, the settings
the checkpoint was trained with; only the `eval` and `parallel` sections come
from the command line. So it refuses:

- a `--config.model.*`, `--config.data.tokenizer` or
  `--config.data.sentencepiece_model` that differs from the run's: it would
  need another checkpoint (`architecture_overrides`; eval-time memory
  variants and sizes are the job of `eval.mem_lens` and `eval.memory_sweep`);
- any other `--config.KEY=VALUE` outside `eval` and `parallel` that differs
  from the run's (`--config.train.num_steps`, `--config.data.batch_size`):
  eval.py would not read it (`unread_overrides`; the evaluation batch is
  `eval.batch_size`).
"""

import json
from typing import Any, Mapping

ARCHITECTURE_PREFIXES = ('model.', 'data.tokenizer', 'data.sentencepiece_model')
EVAL_TIME_PREFIXES = ('eval.', 'parallel.', 'checkpoint.storage_timeout_s')


def flat_settings(config: Mapping, prefix: str = '') -> dict[str, Any]:
  """`{dotted key: JSON text of the value}` of every leaf of a nested mapping."""
  flat = {}
  for key, value in dict(config).items():
    dotted = f'{prefix}{key}'
    if isinstance(value, Mapping) and value:
      flat.update(flat_settings(value, f'{dotted}.'))
    else:
      flat[dotted] = json.dumps(value, sort_keys=True, default=str)
  return flat


def is_architecture_key(key: str) -> bool:
  return any(key == prefix or key.startswith(prefix) for prefix in ARCHITECTURE_PREFIXES)


def architecture_overrides(cli_config: Mapping, saved_config: Mapping,
                           explicit: Mapping | None = None) -> list[str]:
  """Sorted dotted keys of architecture settings of `cli_config` that differ from `saved_config`.

  Args:
    cli_config: the settings the command line gave (nested; only the keys it
      holds are compared: the given ones, or the whole `--config` file's).
    saved_config: the run's `config.json`.
    explicit: the settings given one by one (`--config.KEY=VALUE`; default: all
      of `cli_config`). A key `saved_config` lacks belongs to a setting added
      after the run was trained, which ran as the setting's default does: it is
      reported only when given here, not when it comes with a whole `--config`
      file (which carries every setting's default).
  """
  given = {k: v for k, v in flat_settings(cli_config).items() if is_architecture_key(k)}
  saved = flat_settings(saved_config)
  named = flat_settings(cli_config if explicit is None else explicit)
  return sorted(key for key, value in given.items()
                if (key in saved and saved[key] != value) or (key not in saved and key in named))


def unread_overrides(overrides: Mapping, saved_config: Mapping) -> list[str]:
  """Sorted dotted keys of `overrides` (what `--config.KEY=VALUE` changed) that eval.py
  would not read: outside `eval`, `parallel` and `checkpoint.storage_timeout_s`, not architecture, differing from the run's."""
  saved = flat_settings(saved_config)
  return sorted(key for key, value in flat_settings(overrides).items()
                if not key.startswith(EVAL_TIME_PREFIXES) and not is_architecture_key(key)
                and saved.get(key) != value)


def given_settings(full: Mapping, baseline: Mapping) -> dict:
  """The leaves of `full` that differ from `baseline` (what overrides changed), nested."""
  base = flat_settings(baseline)
  out: dict = {}
  for key, value in flat_settings(full).items():
    if base.get(key) != value:
      node = out
      parts = key.split('.')
      for part in parts[:-1]:
        node = node.setdefault(part, {})
      node[parts[-1]] = json.loads(value)
  return out

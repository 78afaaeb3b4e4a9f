"""Command-line settings eval.py refuses: those that would change the checkpoint's architecture.

eval.py builds the model from the run's `config.json`, the settings the
checkpoint was trained with. A `--config.model.*`, `--config.data.tokenizer`
or `--config.data.sentencepiece_model` that differs from them would need
another checkpoint, so eval.py names it and stops instead of ignoring it.
(Eval-time memory variants and sizes are the job of `eval.mem_lens` and
`eval.memory_sweep`.)
"""

import json
from typing import Any, Mapping

ARCHITECTURE_PREFIXES = ('model.', 'data.tokenizer', 'data.sentencepiece_model')


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


def architecture_overrides(cli_config: Mapping, saved_config: Mapping) -> list[str]:
  """Sorted dotted keys of architecture settings of `cli_config` that differ from `saved_config`.

  Args:
    cli_config: the settings the command line gave (nested; only the keys it
      holds are compared, so pass just the given ones).
    saved_config: the run's `config.json`. A key it lacks (an older run) is
      compared against nothing and reported only when given.
  """
  given = {k: v for k, v in flat_settings(cli_config).items() if is_architecture_key(k)}
  saved = flat_settings(saved_config)
  return sorted(key for key, value in given.items() if saved.get(key) != value)


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

"""The tasks by name (`config.task`): a new task is one file in tasks/ and one line here."""

from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import closest_name
from longformer_jax.tasks import (classification, extractive, image, lm, masked_pretraining, qa,
                                  retrieval, sentence_mask, seq2seq)
from longformer_jax.tasks.base import Task

TASKS = {module.TASK.name: module.TASK for module in (
    lm,
    classification,
    retrieval,
    qa,
    seq2seq,
    image,
    sentence_mask,
    extractive,
    masked_pretraining,
)}


def task_for(name: str) -> Task:
  """The task registered as `name`; an unknown name is a `ConfigError` naming `task`."""
  if not isinstance(name, str) or name not in TASKS:
    raise ConfigError('task', f'{name!r} is not a task; choose one of {tuple(TASKS)}'
                      f'{closest_name(str(name), TASKS)}')
  return TASKS[name]


def readers(attribute: str, key: str | None = None) -> tuple:
  """The names of the tasks whose `attribute` (e.g. `data_keys`) holds `key` (no `key`: whose
  `attribute` is true or non-empty)."""
  def reads(task) -> bool:
    value = getattr(task, attribute)
    return key in value if key is not None else bool(value)
  return tuple(name for name, task in TASKS.items() if reads(task))


def task_keys(attribute: str) -> tuple:
  """Every key some task lists in `attribute`, in first-seen order (the keys only some read)."""
  keys = {}
  for task in TASKS.values():
    keys.update(dict.fromkeys(getattr(task, attribute)))
  return tuple(keys)

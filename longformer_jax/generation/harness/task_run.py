"""lm-eval tasks run on a workdir: tasks found, `simple_evaluate`, WORKDIR/harness/results.json.

Tasks are looked up among this package's own (`lm_eval_tasks/`: the passkey
retrieval tasks) and `include_path` first, and only when a name is not there
among lm-eval's ~15,000 built-in tasks, groups and tags (indexing those takes
seconds). A name no index holds is one line naming the tasks setting and the
closest name (exit status 2 on the command lines). Names may be globs
(`passkey_*`), as on lm-eval's command line.

Bootstrapped standard errors (lm-eval's `perplexity`, `bleu`, ...) use
`BOOTSTRAP_ITERS` resamples in this process: lm-eval's own default of 100,000 is
drawn in a pool of forked processes, and a process running JAX must not fork.
"""

import json
import os

import lm_eval
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable, make_table

from longformer_jax.config.section import closest_name
from longformer_jax.generation.harness.harness_lm import LongformerJaxLM
from longformer_jax.generation.harness.harness_settings import HarnessSettings
from longformer_jax.storage import paths

PACKAGE_TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lm_eval_tasks')
RESULTS_FOLDER = 'harness'
RESULTS_FILE = 'results.json'
BOOTSTRAP_ITERS = 1000


def task_folders(settings: HarnessSettings) -> list[str]:
  """The package's task folder and the settings' `include_path` (checked)."""
  folders = [PACKAGE_TASKS]
  if settings.include_path:
    if not os.path.isdir(settings.include_path):
      raise settings.error('include_path', f'{settings.include_path!r} is not a folder of '
                           'lm-eval task YAML files')
    folders.append(settings.include_path)
  return folders


def matched_tasks(manager: TaskManager, names) -> dict:
  """Requested name -> the index's names it matches (itself, or a glob's matches)."""
  return {name: manager.match_tasks([name]) for name in names}


def find_tasks(settings: HarnessSettings) -> tuple[TaskManager, list[str]]:
  """`(task manager, task names)` of the settings' tasks (module doc); one line for a name
  no index holds."""
  if not settings.tasks:
    raise settings.error('tasks', 'give at least one lm-eval task, e.g. passkey_4k')
  folders = task_folders(settings)
  metadata = settings.task_metadata()
  manager = TaskManager(include_path=folders, include_defaults=False, metadata=metadata)
  matches = matched_tasks(manager, settings.tasks)
  if not all(matches.values()):
    manager = TaskManager(include_path=folders, metadata=metadata)
    matches = matched_tasks(manager, settings.tasks)
  missing = [name for name, found in matches.items() if not found]
  if missing:
    where = ' and '.join([f'lm-eval {lm_eval.__version__}', *folders])
    raise settings.error('tasks', f'no lm-eval task, group or tag {missing[0]!r} in {where}'
                         f'{closest_name(missing[0], manager.all_tasks)}')
  return manager, [name for found in matches.values() for name in found]


def evaluate_tasks(lm: LongformerJaxLM, settings: HarnessSettings, log_samples: bool = False,
                   found: tuple | None = None) -> dict:
  """lm-eval's `simple_evaluate` of the settings' tasks with `lm`: its results dict (and
  each request's responses under 'samples' with `log_samples`). `found`: `find_tasks`'s
  answer, when already asked."""
  manager, tasks = found or find_tasks(settings)
  os.environ.setdefault('DISABLE_MULTIPROC', '1')     # lm-eval: no forked bootstrap pool
  return simple_evaluate(model=lm, tasks=tasks, task_manager=manager,
                         limit=settings.lm_eval_limit(), bootstrap_iters=BOOTSTRAP_ITERS,
                         log_samples=log_samples)


def results_path(workdir: str) -> str:
  return os.path.join(workdir, RESULTS_FOLDER, RESULTS_FILE)


def write_results(results: dict, workdir: str) -> str:
  """Writes `results` (without per-request samples) to WORKDIR/harness/results.json."""
  path = results_path(workdir)
  kept = {key: value for key, value in results.items() if key != 'samples'}
  paths.write_text_atomically(paths.as_path(path),
                              json.dumps(kept, indent=2, default=handle_non_serializable))
  return path


def evaluate_workdir(settings: HarnessSettings) -> dict:
  """The command lines' evaluation: tasks found, the run read, the tasks scored, the results
  printed and written to WORKDIR/harness/results.json."""
  settings.validate()
  found = find_tasks(settings)               # a bad task name before the checkpoint is read
  lm = LongformerJaxLM(batch_size=settings.batch_size, settings=settings)
  results = evaluate_tasks(lm, settings, found=found)
  path = write_results(results, settings.workdir)
  info = lm.get_model_info()
  print(f'{settings.workdir}, checkpoint step {info["checkpoint_step"]}: {info["memory"]}')
  print(make_table(results))
  if 'groups' in results:
    print(make_table(results, 'groups'))
  print(f'wrote {path}')
  return results

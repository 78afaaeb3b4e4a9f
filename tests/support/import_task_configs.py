"""The fine-tuning config `convert.hf --task=TASK` writes for a Hugging Face directory, resolved."""

import os

import ml_collections

from tests.support.repo_paths import REPO_ROOT


def written_task_config(hf_dir: str, workdir, task: str) -> ml_collections.ConfigDict:
  """The config `convert.hf --task=TASK` writes for `hf_dir` into `workdir`, resolved."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from longformer_jax.experiment_config import resolve_config  # pylint: disable=g-import-not-at-top
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={hf_dir}',
       f'--workdir={workdir}', f'--task={task}'],
      cwd=REPO_ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  namespace = {}
  with open(os.path.join(str(workdir), 'import_config.py')) as f:
    exec(f.read(), namespace)  # pylint: disable=exec-used
  config = ml_collections.ConfigDict(resolve_config(namespace['get_config']()))
  assert config.train.init_from_hf == hf_dir and config.task == task
  return config

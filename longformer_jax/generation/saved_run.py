"""A run directory read for generation or export: its config with the default `parallel`
section at the checkpoint's phase (`run_config`), and the one-line refusal of a
`config.json` that does not fit its checkpoint (`config_mismatch_message`). generate.py
and convert/hf_export.py use both."""

import os

import ml_collections

from longformer_jax import command_line
from longformer_jax.checkpoint.resume_checks import CheckpointMismatchError
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.evaluation.run_restore import at_checkpoint_phase, check_saved_run, saved_config


def run_config(workdir: str, step: int) -> ml_collections.ConfigDict:
  """The run's saved config with the default `parallel` section and `eval.step = step`
  (checked as eval.py checks it), at the phase of the checkpoint read."""
  defaults = command_line.experiment_config(command_line.DEFAULT_CONFIG, [])
  # Within the default checkpoint.storage_timeout_s (past it: one line, status 75); the later
  # reads (the checkpoint) within the run's own.
  config = ml_collections.ConfigDict(StorageBound.of(defaults).call(
      'reading the run in', workdir, lambda: saved_config(check_saved_run(workdir)),
      retry=True))
  config.parallel = defaults.parallel
  config.eval.step = step
  return at_checkpoint_phase(config, workdir)


def config_mismatch_message(workdir: str, error: CheckpointMismatchError) -> str:
  """One line: the workdir's config.json builds other shapes than its checkpoint holds."""
  listed = str(error).split('than this run builds: ', 1)[-1]
  listed = listed.split('. The checkpoint is intact', 1)[0]
  return (f'--workdir: {os.path.join(workdir, "config.json")} does not fit the checkpoint '
          f'beside it (was it edited?): {listed}')

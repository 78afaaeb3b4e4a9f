"""Reading a run directory as evaluation does: its `config.json` in today's layout, at the
phase of the checkpoint read, and that checkpoint's parameters without its optimizer state.
eval.py, generate.py (generation/saved_run.py) and the export to Hugging Face
(convert/hf_export.py) all read a run through these."""

import json
import os

from absl import logging
import ml_collections

from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.config.errors import UserError
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.saved_config import migrate_saved_config
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.storage import paths
from longformer_jax.train import initialization, phases
from longformer_jax.train.optimizer import make_optimizer


def check_saved_run(workdir: str) -> str:
  """The path of `workdir`'s `config.json`; one line (`ConfigError` / `UserError` naming
  --workdir) when the bucket is missing (worded as train.py words it), the workdir is not a
  directory, or it holds no `config.json`. eval.py and generate.py check a run with it."""
  paths.check_bucket(workdir, '--workdir')
  if not paths.as_path(workdir).is_dir():
    raise UserError(f'--workdir: {workdir!r} is not a directory (a train.py workdir)')
  path = os.path.join(workdir, 'config.json')
  if not paths.as_path(path).exists():
    raise UserError(f'--workdir: {path} not found: is {workdir!r} a train.py workdir?')
  return path


def saved_config(path: str, log: bool = False) -> dict:
  """The run's `config.json` in today's layout (an old run's flat model keys moved;
  `log`: one info line per moved or dropped key)."""
  values, changes = migrate_saved_config(json.loads(paths.as_path(path).read_text()))
  if log:
    for old, new in changes:
      logging.info('%s: %s -> %s', path, old, new)
  return values


def at_checkpoint_phase(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """A phased run's config with the chunk length and window of the evaluated checkpoint's phase."""
  if config.train.phases == 1:
    return config

  def latest() -> 'int | None':
    with Checkpointer(workdir, config.train.keep_checkpoints, async_save=False) as checkpointer:
      return checkpointer.latest_step()
  step = (StorageBound.of(config).call('listing the checkpoints in', workdir, latest, retry=True)
          if config.eval.step < 0 else config.eval.step)
  if step is None:
    return config
  phase = phases.phase_of_state(phases.training_phases(config), step)
  config = ml_collections.ConfigDict(config.to_dict())
  config.model = phases.phase_model_config(config.model, phase)
  config.data.chunk_len = phase.chunk_len
  return config


def restore_params(config, tokenizer, workdir: str, mesh, rules):
  """`(params, param_shardings, step, model_state)` of the requested (or latest) checkpoint
  (`model_state`: the non-gradient state, train/train_state.py; `{}` for most models). The
  optimizer state and memory are not read (`Checkpointer.restore_params`)."""
  model = DecoderLM(lm_model_config(config.model, tokenizer.vocab_size))
  # The optimizer train.py built (a phased run chains a phase scale): same state layout.
  optimizer = phases.phased_optimizer(make_optimizer(config.optimizer, config.train.num_steps),
                                      phases.training_phases(config))
  abstract, shardings = initialization.abstract_train_state(
      model, optimizer, config.seed, config.data.batch_size, config.data.chunk_len, mesh, rules)
  step = None if config.eval.step < 0 else config.eval.step

  def read():   # None: no checkpoint yet (reported outside the bound, as a usage error)
    with Checkpointer(workdir, config.train.keep_checkpoints, async_save=False) as checkpointer:
      if checkpointer.latest_step() is None:
        return checkpointer.directory, None
      return checkpointer.directory, checkpointer.restore_params(step, abstract)
  directory, restored = StorageBound.of(config).call('restoring the checkpoint in', workdir, read,
                                                retry=True)
  if restored is None:
    raise FileNotFoundError(f'no checkpoint in {directory}; train first')
  params, model_state, step = restored
  return params, shardings.params, step, model_state


def read_run(workdir: str) -> tuple:
  """`(config, tokenizer, params, step, model_state)` of a language-model run: its
  config.json as saved (today's layout), its tokenizer, and the latest checkpoint's
  parameters on the run's mesh (what the analysis scripts under benchmarks/ read)."""
  config = ml_collections.ConfigDict(saved_config(os.path.join(workdir, 'config.json')))
  tokenizer = make_tokenizer(config.data)
  mesh = make_mesh(config.parallel.mesh_shape)
  params, _, step, model_state = restore_params(config, tokenizer, workdir, mesh,
                                                config.parallel.logical_axis_rules)
  return config, tokenizer, params, step, model_state

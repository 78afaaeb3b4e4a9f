"""Starting extractive fine-tuning from a sentence_mask run: `model.hibert.init_from=WORKDIR`.

A fresh `extractive` state takes the encoder parameters (the `hibert/`
subtree: token embedding, sentence and document encoders) of the newest
checkpoint in WORKDIR, a `sentence_mask` run; the classifier keeps its fresh
initialisation and the optimizer starts fresh (its moments are zeros, so
replacing the parameters after creating the state is exact). A resumed
fine-tuning run restores its own checkpoint instead (WORKDIR must still hold
its checkpoint: `check_init_from` runs at every start).

The pretraining run's `config.json` is read in today's layout
(`models/saved_config.migrate_saved_config`), its sections completed with
their defaults (`saved_run_config`).
"""

import json
import os

import jax
import ml_collections

from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.hibert import HibertConfig
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.saved_config import migrate_saved_config
from longformer_jax.tasks.pretrained_encoder import require_pretraining_run
from longformer_jax.tasks.sentence_mask import TASK as PRETRAINING
from longformer_jax.train.example_state import abstract_task_state
from longformer_jax.train.optimizer import make_optimizer
from longformer_jax.train.optimizer_config import OptimizerConfig
from longformer_jax.train.train_config import TrainConfig

KEY = 'model.hibert.init_from'
SCOPE = 'hibert'
SECTIONS = {'data': DataConfig, 'optimizer': OptimizerConfig, 'train': TrainConfig}


def check_init_from(config: ml_collections.ConfigDict) -> None:
  """Fails early (`ConfigError` naming the key) unless WORKDIR holds a sentence_mask run."""
  workdir = config.model.hibert.init_from
  if not workdir:
    return
  require_pretraining_run(workdir, KEY, PRETRAINING.name)


def saved_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The sentence_mask run's `config.json` in today's layout, every section complete."""
  with open(os.path.join(workdir, 'config.json')) as f:
    values, _ = migrate_saved_config(json.load(f))
  for name, section in SECTIONS.items():
    values[name] = section.build(values.get(name), name).to_dict()
  model = dict(values['model'])
  hibert = HibertConfig.build(model.pop('hibert', None), 'model.hibert')
  values['model'] = resolve_model(model, 'model', PRETRAINING.chunk_lengths(
      None, None, None, hibert))
  PRETRAINING.complete_model(values['model'], hibert)
  return ml_collections.ConfigDict(values)


def pretrained_params(workdir: str, mesh, rules):
  """The parameters of the newest checkpoint of the sentence_mask run in `workdir`."""
  saved = saved_run_config(workdir)
  tokenizer = make_tokenizer(saved.data)
  _, model = PRETRAINING.model(saved, tokenizer.vocab_size)
  optimizer = make_optimizer(saved.optimizer, saved.train.num_steps)
  abstract, _, _ = abstract_task_state(
      model, PRETRAINING.init_arguments, optimizer, saved.seed,
      PRETRAINING.example_batch(saved, saved.data.batch_size), mesh, rules)
  with Checkpointer(workdir, saved.train.keep_checkpoints, async_save=False) as checkpointer:
    state, _ = checkpointer.restore(None, abstract)
  return state.params


def with_pretrained_encoder(config: ml_collections.ConfigDict, state, mesh, rules):
  """`state` with the `hibert/` parameters of `config.model.hibert.init_from` (if set)."""
  workdir = config.model.hibert.init_from
  if not workdir:
    return state
  check_init_from(config)
  # Within the run's checkpoint.storage_timeout_s, as its own checkpoints (status 75 past it).
  source = StorageBound.of(config).call('restoring the pretrained encoder from', workdir,
                      lambda: pretrained_params(workdir, mesh, rules), retry=True)[SCOPE]
  target = state.params[SCOPE]
  source_shapes = jax.tree_util.tree_map(lambda x: x.shape, source)
  target_shapes = jax.tree_util.tree_map(lambda x: x.shape, target)
  if source_shapes != target_shapes:
    raise ConfigError(KEY, f'the encoder of {workdir!r} has other shapes than this model '
                      '(model.* and data.tokenizer must match the pretraining run)')
  copied = jax.tree_util.tree_map(lambda new, old: jax.device_put(old, new.sharding), target, source)
  return state.replace(params=dict(state.params, **{SCOPE: copied}))

"""Fine-tuning a self-pretrained encoder: `train.init_from=WORKDIR` (task classification).

A fresh `classification` state takes the input and encoder parameters (scopes `embedding`,
`position_embedding`, `embedding_norm`, `encoder`: those `MaskedLM` and
`SequenceClassifier` share, models/masked_lm.py) of the newest checkpoint in WORKDIR, a
`masked_pretraining` run (tasks/masked_pretraining.py). The token embedding keeps the
classifier's rows: the [MASK] id, when the vocabulary's padding to a multiple of 8 does not
already hold it, is a row the classifier does not have and never reads. The pooler and the classifier keep their
fresh initialisation, the optimizer starts fresh (its moments are zeros, so replacing the
parameters after creating the state is exact), and a model's non-gradient state (the
Routing Transformer's centroids) starts fresh too. A resumed fine-tuning run restores its
own checkpoint instead; WORKDIR must still hold its checkpoint (`check_init_from` runs at
every start).
"""

import os

from absl import logging
import jax
import ml_collections
import numpy as np

from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.evaluation.run_restore import saved_config
from longformer_jax.evaluation.task_report import restore_task_state
from longformer_jax.tasks.masked_pretraining import TASK as PRETRAINING

KEY = 'train.init_from'
SHARED_SCOPES = ('embedding', 'position_embedding', 'embedding_norm', 'encoder')


def require_pretraining_run(workdir: str, key: str, task_name: str) -> None:
  """`ConfigError` naming `key` unless `workdir` holds a `config.json` of task `task_name`
  and a checkpoint (the start of a fine-tuning from it; HIBERT's too, tasks/hibert_init.py)."""
  path = os.path.join(workdir, 'config.json')
  require(os.path.isfile(path), key, f'{workdir!r} has no config.json (not a run directory)')
  checkpoints = os.path.join(workdir, 'checkpoints')
  steps = [d for d in os.listdir(checkpoints) if d.isdigit()] if os.path.isdir(checkpoints) else []
  require(bool(steps), key, f'{workdir!r} has no checkpoint')
  saved_task = saved_config(path).get('task')
  require(saved_task == task_name, key,
          f'{workdir!r} is a {saved_task!r} run; it must be a {task_name} run')


def check_init_from(config: ml_collections.ConfigDict) -> None:
  """Fails early (`ConfigError` naming the key) unless WORKDIR holds a checkpointed
  masked_pretraining run, and unless `train.init_from_hf` is off."""
  workdir = config.train.init_from
  if not workdir:
    return
  require(not config.train.init_from_hf, KEY,
          'and train.init_from_hf both set: start from one of them')
  require_pretraining_run(workdir, KEY, PRETRAINING.name)


def pretrained_params(workdir: str, mesh) -> tuple[dict, int]:
  """`(params, step)` of the newest checkpoint of the masked_pretraining run in `workdir`."""
  saved = ml_collections.ConfigDict(saved_config(os.path.join(workdir, 'config.json')))
  saved.eval.step = -1
  length = saved.data.seq_len
  shapes = {'inputs': np.zeros((1, length), np.int32), 'input_mask': np.ones((1, length), bool),
            'global_flags': np.zeros((1, length), bool), 'weight': np.ones((1,), np.float32)}
  _, _, state, _ = restore_task_state(saved, workdir, PRETRAINING, shapes, mesh)
  return state.params, int(state.step)


def encoder_params(source: dict, target: dict, workdir: str) -> dict:
  """The shared scopes of `target` (fresh classifier parameters) taken from `source` (the
  pretraining run's), the token embedding cut to the classifier's rows; a `ConfigError` naming the
  key when a scope is missing or its shapes differ."""
  taken = {}
  for scope in SHARED_SCOPES:
    if scope not in target:
      continue
    if scope not in source:
      raise ConfigError(KEY, f'the run in {workdir!r} has no {scope!r} parameters: '
                        'model.* must match the pretraining run')
    old = source[scope]
    if scope == 'embedding':       # rows past the classifier's: [MASK] and vocabulary padding
      old = jax.tree_util.tree_map(
          lambda o, n: o[:n.shape[0]] if o.shape[1:] == n.shape[1:] and o.shape[0] > n.shape[0]
          else o, old, target[scope])
    old_shapes = jax.tree_util.tree_map(np.shape, old)
    new_shapes = jax.tree_util.tree_map(np.shape, target[scope])
    if old_shapes != new_shapes:
      raise ConfigError(KEY, f'the {scope!r} parameters of {workdir!r} have other shapes than '
                        'this model (model.*, data.tokenizer and data.seq_len must match the '
                        'pretraining run)')
    taken[scope] = jax.tree_util.tree_map(lambda n, o: jax.device_put(o, n.sharding),
                                          target[scope], old)
  return taken


def with_pretrained_encoder(config: ml_collections.ConfigDict, state, mesh):
  """`state` with the shared scopes of `config.train.init_from`'s newest checkpoint (if set)."""
  workdir = config.train.init_from
  if not workdir:
    return state
  check_init_from(config)
  # Within the run's checkpoint.storage_timeout_s, as its own checkpoints (status 75 past it).
  source, step = StorageBound.of(config).call('restoring the pretrained encoder from', workdir,
                                              lambda: pretrained_params(workdir, mesh),
                                              retry=True)
  taken = encoder_params(source, state.params, workdir)
  logging.info('Started from the pretrained %s of %s (step %d)', ', '.join(taken), workdir, step)
  return state.replace(params=dict(state.params, **taken))

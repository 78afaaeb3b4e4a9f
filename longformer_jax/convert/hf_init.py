"""Fine-tuning an imported encoder: `train.init_from_hf=HF_DIR` (classification, qa, seq2seq).

A fresh task state takes the parameters of the Hugging Face checkpoint in
HF_DIR (a Longformer for classification and QA, an LED for seq2seq;
convert/): every imported scope the task's model also has (`embedding`,
`position_embedding`, `embedding_norm`, `encoder`, the LED decoder's) must
have exactly its shapes and is copied; so is a head of the checkpoint the task's
model has (a `LongformerForSequenceClassification`'s classifier for task
classification, a `LongformerForQuestionAnswering`'s span logits for qa;
convert/longformer_heads.py), while the heads it lacks (`HEAD_SCOPES` of the
family, e.g. the masked-LM head) are dropped; a head the checkpoint does not
have (pooler, classifier, span logits) keeps its fresh initialisation. A
classifier checkpoint fixes task classification's `model.num_classes` (its
`num_labels`; `head_settings` of the family).
The optimizer's moments start at zero, so replacing the parameters after
creating the state is exact. A resumed run restores its own checkpoint.

The model settings must be the checkpoint's (`model_settings` of its
family, so that the same parameters mean the same function); a difference is
a `ConfigError` naming the key, except `FREE_SETTINGS` (dropout, and the
number of global tokens, which the task sets). `convert.hf --task=...`
writes a config file with exactly those settings.

The tasks it serves are those with an `hf_checkpoint` of 'encoder' or
'encoder_decoder' (tasks/); train.py hands this module to the task
(`ExampleTraining`'s `param_import`), so nothing below convert/ imports it.
"""

from absl import logging
import jax
import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import hf_source, loader
from longformer_jax.convert.errors import ConversionError
from longformer_jax.tasks.registry import TASKS, task_for

KEY = 'train.init_from_hf'
# The kinds of checkpoint a task fine-tunes from here (a decoder imports as a workdir).
FINE_TUNED = ('encoder', 'encoder_decoder')
FREE_SETTINGS = ('dropout_rate', 'longformer.global_tokens')


def flat_settings(values: dict, prefix: str = '') -> dict:
  """`{'a.b': value}` of a nested settings dict."""
  flat = {}
  for key, value in values.items():
    if isinstance(value, dict) and key != 'rope_scaling':
      flat.update(flat_settings(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def imported(config: ml_collections.ConfigDict) -> tuple[dict, dict, object]:
  """`(hf_config, settings, family module)` of `config.train.init_from_hf`, checked against
  the task and `config.model` (`ConfigError` naming the key)."""
  hf_dir = config.train.init_from_hf
  task = task_for(config.task)
  if task.hf_checkpoint not in FINE_TUNED:
    names = [name for name, other in TASKS.items() if other.hf_checkpoint in FINE_TUNED]
    raise ConfigError(KEY, f'is for the tasks {", ".join(names)} (task is {config.task!r}); '
                      f'a decoder is imported as a workdir: python -m longformer_jax.convert.hf')
  try:
    with hf_source.local_hf_dir(hf_dir, only=('config.json',)) as local_dir:
      hf_config, settings = loader.model_settings(local_dir)
  except ConversionError as e:
    raise ConfigError(KEY, str(e)) from None
  family = loader.family(hf_config)
  kind = checkpoint_kind(family)
  if task.hf_checkpoint != kind:
    wanted = ' or '.join(name for name, other in TASKS.items() if other.hf_checkpoint == kind)
    raise ConfigError(KEY, f'{hf_config["model_type"]!r} checkpoints fine-tune for task '
                      f'{wanted}, not {config.task!r}')
  model = flat_settings(config.model.to_dict())
  for key, value in flat_settings(settings).items():
    if key not in FREE_SETTINGS and model.get(key) != value:
      raise ConfigError(f'model.{key}', f'{model.get(key)!r}, but the checkpoint in {KEY} '
                        f'needs {value!r} (python -m longformer_jax.convert.hf --task=... '
                        f'writes a config with its settings)')
  for key, value in loader.head_settings(hf_config).items():   # a classifier's classes
    if key in task.model_keys and model.get(key) != value:
      raise ConfigError(f'model.{key}', f'{model.get(key)!r}, but the classifier of the '
                        f'checkpoint in {KEY} has {value} labels (num_labels)')
  return hf_config, settings, family


def checkpoint_kind(family) -> str:
  """'encoder_decoder' | 'encoder' | 'decoder': the tasks' `hf_checkpoint` a family serves."""
  if getattr(family, 'ENCODER_DECODER', False):
    return 'encoder_decoder'
  return 'encoder' if getattr(family, 'ENCODER', False) else 'decoder'


def with_imported_params(config: ml_collections.ConfigDict, state):
  """`state` with the parameters of `config.train.init_from_hf` (if set; module docstring)."""
  if not config.train.init_from_hf:
    return state
  hf_config, settings, family = imported(config)
  try:
    with hf_source.local_hf_dir(config.train.init_from_hf) as local_dir:
      params = loader.load_params(local_dir, hf_config, settings)
  except ConversionError as e:
    raise ConfigError(KEY, str(e)) from None
  heads = getattr(family, 'HEAD_SCOPES', ())
  copied, dropped = dict(state.params), []
  for scope, tree in params.items():
    if scope not in state.params:
      if scope in heads:
        dropped.append(scope)
        continue
      raise ConfigError(KEY, f'the checkpoint has parameters {scope!r} that the {config.task} '
                        f'model lacks')
    target = state.params[scope]
    shapes = lambda t: jax.tree_util.tree_map(lambda x: tuple(x.shape), t)
    if shapes(tree) != shapes(target):
      raise ConfigError(KEY, f'the checkpoint\'s {scope!r} parameters have other shapes than '
                        f'the {config.task} model\'s (model.* and the tokenizer must be the '
                        f'checkpoint\'s)')
    copied[scope] = jax.tree_util.tree_map(
        lambda new, old: jax.device_put(np.asarray(old, np.float32), new.sharding), target, tree)
  logging.info('Parameters %s from %s (dropped: %s; fresh: %s)',
               ', '.join(s for s in params if s not in dropped), config.train.init_from_hf,
               ', '.join(dropped) or 'none',
               ', '.join(s for s in state.params if s not in params) or 'none')
  return state.replace(params=copied)

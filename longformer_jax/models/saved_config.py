"""An old run's `config.json` in today's layout.

Its model section's old flat keys move to the sections that own them now
(`config/migration.py` names them); settings the old run did not read are
dropped. train.py's resume check, eval.py and generate.py read every saved
config through `migrate_saved_config`.
"""

from typing import Mapping

import ml_collections

from longformer_jax.attention.registry import ATTENTION_VARIANTS
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.model_config import ModelConfig, section_classes


def plain_dict(values) -> dict:
  """A `ConfigDict` or nested mapping as nested plain dicts."""
  if isinstance(values, ml_collections.ConfigDict):
    return values.to_dict()
  return {k: plain_dict(v) if isinstance(v, Mapping) else v for k, v in dict(values).items()}


def migrate_saved_config(values: Mapping) -> tuple:
  """An old run's `config.json` (flat `model` keys) in today's layout: `(values, changes)`.

  Old flat keys move to the section that owns them now (`model.window` ->
  `model.longformer.window`). Settings the old code did not read (a section
  of a variant the model does not use, `mem_len` of a variant without a
  cache) are dropped: the run did not use them. `changes` lists
  `(old key, what happened)` for a log line.
  """
  values = plain_dict(values)
  model = values.get('model')
  if not isinstance(model, Mapping) or not any(k not in ModelConfig.field_names() and k not in
                                               section_classes() and k != 'hibert' for k in model):
    return values, []
  model, moved = migrate_flat_model(model)
  schedule = str(dict(model.get('layer_schedule') or {}).get('attention', ''))
  attentions = {model.get('attention', ModelConfig.attention)} | {
      name.strip() for name in schedule.split(',') if name.strip()}
  used = attentions | {model.get('block', ModelConfig.block), model.get('stack', ModelConfig.stack)}
  changes = [(f'model.{old}', f'model.{new}' if new.split('.')[0] in used
               else 'dropped (no layer reads it)') for old, new in moved]
  for name in [k for k in model if k in section_classes() and k not in used]:
    del model[name]
  schedule_values = dict(model.get('layer_schedule') or {})
  for name in [k for k in schedule_values if k in section_classes() and k not in used]:
    del schedule_values[name]
  if 'layer_schedule' in model:
    model['layer_schedule'] = schedule_values
  readers = [a for a in attentions if getattr(ATTENTION_VARIANTS.get(a), 'reads_mem_len', False)]
  if model.get('mem_len') and not readers:
    del model['mem_len']
    changes.append(('model.mem_len', 'dropped (the attention keeps no cache)'))
  values['model'] = model
  return values, changes

"""A model's attention described from its per-layer configs, for logs and evaluation reports.

  describe_model(xl, mem_len 16)                    -> 'xl attention (mem_len 16)'
  describe_model(layer_schedule attention 'xl,xl,memorizing,xl')
      -> 'memorizing (memory 512) in layer 2, xl (mem_len 16) elsewhere'
  describe_model(attendre)                          -> 'attendre attention (memory 128, fifo)'

Each layer is named by its attention variant and the settings that size its
memory or context: `mem_len` for the variants that keep a cache of past
hidden states, the memory size and eviction policy of Attendre, the memory
size of Memorizing Transformers, sinks and window of StreamingLLM, the
Longformer window.
"""

import collections

from longformer_jax.attention.registry import ATTENTION_VARIANTS
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.resolved_model import ResolvedModel, resolved_model


def layer_label(layer) -> tuple[str, str]:
  """`(variant, its memory/context settings or '')` of one layer's config."""
  name = layer.attention
  if name == 'attendre':
    section = layer.attendre
    details = [f'memory {section.memory_size}', str(section.policy)]
    if section.q_memory_size:
      details.append(f'q_memory {section.q_memory_size}')
    return name, ', '.join(details)
  if name == 'memorizing':
    return name, f'memory {layer.memorizing.memory_size}'
  if name == 'streaming_sinks':
    return name, f'{layer.streaming_sinks.num_sinks} sinks, window {layer.streaming_sinks.window}'
  if name == 'longformer':
    return name, f'window {layer.longformer.window}'
  if getattr(ATTENTION_VARIANTS[name], 'reads_mem_len', False) and layer.mem_len:
    return name, f'mem_len {layer.mem_len}'
  return name, ''


def _with_details(label: tuple[str, str]) -> str:
  name, details = label
  return f'{name} ({details})' if details else name


def _layers_text(indices: list[int]) -> str:
  if len(indices) == 1:
    return f'layer {indices[0]}'
  return 'layers ' + ', '.join(str(i) for i in indices)


def describe_model(model_config) -> str:
  """One phrase naming every layer's attention (see the module docstring).

  Args:
    model_config: a resolved model (models/resolved_model.py), or a resolved
      `config.model` mapping that becomes one (every section present).
  """
  if not isinstance(model_config, ResolvedModel):
    model_config = resolved_model(model_config)
  labels = [layer_label(layer_config(model_config, i)) for i in range(model_config.num_layers)]
  if len(set(labels)) == 1:
    name, details = labels[0]
    return f'{name} attention' + (f' ({details})' if details else '')
  by_label = collections.defaultdict(list)
  for index, label in enumerate(labels):
    by_label[label].append(index)
  most_common = max(by_label, key=lambda label: len(by_label[label]))
  parts = [f'{_with_details(label)} in {_layers_text(indices)}'
           for label, indices in by_label.items() if label != most_common]
  parts.append(f'{_with_details(most_common)} elsewhere')
  return ', '.join(parts)

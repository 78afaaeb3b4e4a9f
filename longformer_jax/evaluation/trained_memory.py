"""The passkey grid's `trained` memory: the model's own memory, as it was trained.

A model trained with its memory in the loop (configs/passkey_memory.py) is
evaluated with that memory, not with one of the eval-time memories of
evaluation/memory_sweep.py. `trained` keeps every setting of the run;
`trained:SIZE` changes only the memory's size, the setting that bounds what
it can hold:

| trained memory | SIZE sets |
|---|---|
| Memorizing layer anywhere in the stack (kNN) | `memorizing.memory_size` |
| Attendre | `attendre.memory_size` |
| StreamingLLM sinks | `streaming_sinks.window` |
| every other variant (XL, compressive, Expire-Span, Adaptive-Span, vanilla) | `mem_len` |

so `trained:65536` on the kNN model is a memory holding the whole of a
64k-token document, and `trained:512` a FIFO kNN memory of 512 entries.
"""

import ml_collections

from longformer_jax.models import layer_schedule

SIZE_SECTIONS = {'memorizing': 'memory_size', 'attendre': 'memory_size',
                 'streaming_sinks': 'window'}


def _plain(value):
  return value.to_dict() if hasattr(value, 'to_dict') else dict(value)


def memory_kind(model: ml_collections.ConfigDict) -> str:
  """The variant whose memory the run trained: a scheduled Memorizing layer wins, as it
  holds the long memory; else `model.attention`."""
  schedule = _plain(model.layer_schedule).get('attention', '')
  scheduled = schedule.split(',') if isinstance(schedule, str) else list(schedule)
  return 'memorizing' if 'memorizing' in scheduled else model.attention


def size_key(model: ml_collections.ConfigDict) -> str:
  """The setting that `trained:SIZE` changes, e.g. 'memorizing.memory_size' or 'mem_len'."""
  kind = memory_kind(model)
  return f'{kind}.{SIZE_SECTIONS[kind]}' if kind in SIZE_SECTIONS else 'mem_len'


def trained_size(model: ml_collections.ConfigDict) -> int:
  """The memory's size as trained (the value of `size_key`)."""
  kind = memory_kind(model)
  return int(model[kind][SIZE_SECTIONS[kind]] if kind in SIZE_SECTIONS else model.mem_len)


def trained_q_memory(model: ml_collections.ConfigDict) -> int:
  """The Q memory the run trained with (Attendre's `q_memory_size` on the delayed stack; with
  a per-layer schedule, the largest layer's), else 0."""
  if memory_kind(model) != 'attendre' or model.stack != 'attendre_delay':
    return 0
  per_layer = dict(layer_schedule.leaves(_plain(model.layer_schedule)))
  scheduled = per_layer.get(('attendre', 'q_memory_size'))
  if scheduled is None:
    return int(model.attendre.q_memory_size)
  return max(int(v) for v in layer_schedule.items_of(
      scheduled, model.num_layers, 'model.layer_schedule.attendre.q_memory_size'))


def model_overrides(model: ml_collections.ConfigDict, size: int) -> dict:
  """Top-level model keys for `lm_model_config(model, vocab, **overrides)`: nothing for
  size 0 (as trained), else the size setting (its whole section, one key changed)."""
  if size == 0:
    return {}
  kind = memory_kind(model)
  if kind not in SIZE_SECTIONS:
    return {'mem_len': size}
  section = _plain(model[kind])
  section[SIZE_SECTIONS[kind]] = size
  return {kind: section}

"""Which trained models `generate.py` can decode exactly, and why the others cannot.

The chunk-window decoder (`chunk_window_decoder.py`) re-runs the current
chunk with the tokens not generated yet as padding. Its logits equal the
chunked forward over the whole sequence exactly when a layer's output at
position t does not depend on the chunk's tokens after t, neither on their
content nor on whether they are padding. That holds for a causal variant
whose masks, memory reads and evictions before attending depend only on
positions <= t (docs/design.md, contract 2). It fails for:

- a task other than the language model ('lm'): encoder tasks have no
  next-token head; the image task draws images (eval.py's image samples);
- `model.causal = False`: bidirectional attention reads later tokens;
- LSH attention (causal or not): a query's keys are those of its bucket in
  its chunk of the (bucket, position) sort, and later tokens move where the
  sort cuts those chunks;
- Attendre with delayed queries (`q_memory_size > 0`, the time-shifted
  stack): the output at a slot answers the query N positions back, so the
  logits that predict the token after t come only after N more tokens (the
  decoder reads the next token at the last valid slot);
- Attendre with `order='insert_first'`: the chunk's keys are inserted (and
  the memory's victims evicted) before any query attends, so later tokens
  evict keys that earlier queries would have seen.

tests/generation/test_generation.py runs every registered variant (`-m slow`) and checks
that the refused ones do change earlier outputs and the accepted ones do not.
"""

import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.resolved_model import ResolvedModel, resolved_model
from longformer_jax.tasks.registry import readers, task_for


def layer_refusal(layer: ResolvedModel) -> tuple[str, str] | None:
  """`(config key, reason)` why one layer's attention cannot generate, or None."""
  name = layer.attention
  if name == 'lsh':
    return ('model.attention', "'lsh' cannot generate exactly: a query's keys depend on "
            'where the (bucket, position) sort cuts its chunk, which later tokens move')
  if name == 'attendre':
    section = layer.attendre
    if section.q_memory_size > 0:
      return ('model.attendre.q_memory_size', f'{section.q_memory_size}: delayed queries '
              'answer a position only N tokens later, so they cannot generate; generation '
              'needs 0')
    if section.order == 'insert_first':
      return ('model.attendre.order', "'insert_first' lets later tokens of a chunk evict keys "
              "that earlier queries attend to; generation needs 'attend_first'")
  return None


def refusal(config: ml_collections.ConfigDict) -> tuple[str, str] | None:
  """`(config key, reason)` why the run's model cannot generate text, or None."""
  if not task_for(config.task).generates_text:
    generators = ' or '.join(repr(name) for name in readers('generates_text'))
    return ('task', f'{config.task!r} cannot generate text: only language models (task '
            f'{generators}) have a next-token head')
  model = config.model
  if not model.causal:
    return ('model.causal', 'False: a bidirectional model reads later tokens, so it cannot '
            'generate')
  resolved = resolved_model(model)
  for index in range(model.num_layers):
    found = layer_refusal(layer_config(resolved, index))
    if found is not None:
      key, reason = found
      prefix = f'layer {index}: ' if model.get('layer_schedule') else ''
      return key, prefix + reason
  return None


def check_can_generate(config: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` naming the setting that keeps the model from generating."""
  found = refusal(config)
  if found is not None:
    raise ConfigError(*found)

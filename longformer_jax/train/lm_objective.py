"""Next-token loss of a decoder LM over the chunks of a step.

The batch is a dict of `[batch, n_chunks * chunk_len]` arrays: `inputs`,
`targets`, `positions`, `segment_ids`, `doc_start`, `input_mask`,
`target_mask` (see `longformer_jax.train.steps.step_arrays`). The chunk driver scans
the model over the chunks; losses are summed inside the scan so that the
logits of only one chunk are alive at a time.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.config.errors import ConfigError
from longformer_jax.models.attendre_delay import total_delay
from longformer_jax.models.chunk_driver import scan_chunks
from longformer_jax.train.delayed_targets import drained_batch, require_hidden_targets

AUX_PREFIX = 'aux/'


def weighted_aux_losses(aux_per_layer, weights) -> tuple[jax.Array, dict]:
  """The weighted sum of the layers' auxiliary losses, and their statistics.

  Args:
    aux_per_layer: one dict of float32 scalars per layer (the attention
      call contract's `aux`). Keys ending in `_loss` are losses; the rest
      are statistics.
    weights: `model.aux_loss_weights`, loss name -> weight.
  Returns:
    `(objective, stats)`: `objective` is sum over layers of weight * loss;
    `stats` maps `aux/<name>` to the sum over layers (losses, unweighted) or
    the mean over layers (statistics).
  """
  objective = jnp.zeros((), jnp.float32)
  collected = {}
  for aux in aux_per_layer:
    for name, value in aux.items():
      value = jnp.asarray(value, jnp.float32)
      if name.endswith('_loss'):
        if name not in weights:
          raise ConfigError(f'model.aux_loss_weights.{name}',
                            f'the model reports the auxiliary loss {name!r} but no weight is set')
        objective = objective + weights[name] * value
      collected.setdefault(name, []).append(value)
  stats = {}
  for name, values in collected.items():
    total = sum(values)
    stats[AUX_PREFIX + name] = total if name.endswith('_loss') else total / len(values)
  return objective, stats


def chunk_context(chunk: dict, deterministic: bool,
                  step: Optional[jax.Array] = None) -> AttentionContext:
  """The attention context of one `[batch, chunk_len]` chunk (`step`: the training step)."""
  return AttentionContext(
      positions=chunk['positions'],
      segment_ids=chunk['segment_ids'],
      reset=chunk['doc_start'][:, 0],
      valid=chunk['input_mask'],
      predicted=chunk.get('predicted'),
      step=step,
      deterministic=deterministic)


def subset_sums(nll: jax.Array, targets: jax.Array, subset: jax.Array,
                token_bytes: Optional[jax.Array]) -> dict:
  """Loss, token and byte sums over the float `[batch, chunk]` mask `subset`."""
  sums = {'subset/loss_sum': jnp.sum(nll * subset), 'subset/tokens': jnp.sum(subset)}
  if token_bytes is not None:
    sums['subset/bytes'] = jnp.sum(token_bytes[targets] * subset)
  return sums


def lm_sums(model: nn.Module, params, memory, batch: dict, chunk_len: int, *,
            model_state=None, **options):
  """`(memory, sums)` of `lm_sums_with_state` with the model state read, not returned
  (evaluation; models without model state). `options` as there."""
  memory, _, sums = lm_sums_with_state(model, params, model_state or {}, memory, batch,
                                       chunk_len, **options)
  return memory, sums


def lm_sums_with_state(model: nn.Module, params, model_state, memory, batch: dict,
                       chunk_len: int, *, rng: Optional[jax.Array] = None,
                       deterministic: bool = True, token_bytes: Optional[jax.Array] = None,
                       step: Optional[jax.Array] = None):
  """Scans the model over the step's chunks and sums the next-token loss.

  Args:
    model: a `DecoderLM`.
    params: its parameters.
    model_state: its collection `model_state` (train/train_state.py), `{}` if
      it has none. Training (not `deterministic`) updates it chunk by chunk.
    memory: the memory pytree at the start of the step.
    batch: `[batch, n * chunk_len]` arrays (module docstring).
    chunk_len: tokens per chunk.
    rng: dropout key (folded with the chunk index), needed when not
      deterministic.
    token_bytes: optional `[vocab]` int32 UTF-8 bytes per token; adds
      `bytes`, the number of bytes the valid targets stand for.
    step: optional int32 training step, passed to attention as `ctx.step`.
  Returns:
    `(memory, model_state, sums)`: `sums` has float32 scalars `loss_sum` (nats), `tokens`,
    `objective_sum` (the loss plus the weighted auxiliary losses, each
    chunk's weighted by its number of target tokens, so that dividing by
    `tokens` gives the per-token objective), `chunks`, the per-chunk sums of
    the `aux/...` statistics (divide by `chunks` for the mean), and `bytes`
    when `token_bytes` is given. A batch with a bool `subset_mask` (some
    of the targets, e.g. far recurrences) adds `subset_sums` over it.

  A time-shifted stack (Attendre's Q memory, delay D) reads D more padding
  slots, whole chunks, and its targets move D slots right, so that each
  target meets its own logits within the step (train/delayed_targets.py); under
  causal=False its predicted inputs are flagged and hidden from earlier queries.
  """
  weights = model.config.aux_loss_weights
  delay = total_delay(model.config)
  batch = drained_batch(batch, delay, chunk_len,
                        flag_predicted=require_hidden_targets(model.config, delay))

  def one_chunk(carry, chunk, index):
    states, model_state = carry
    rngs = {} if deterministic else {'dropout': jax.random.fold_in(rng, index)}
    variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}
    arguments = (chunk['inputs'], states, chunk_context(chunk, deterministic, step))
    if model_state and not deterministic:
      (logits, states, aux), updated = model.apply(variables, *arguments, rngs=rngs,
                                                   mutable=[MODEL_STATE])
      model_state = updated[MODEL_STATE]
    else:
      logits, states, aux = model.apply(variables, *arguments, rngs=rngs)
    mask = chunk['target_mask'].astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, chunk['targets'])
    aux_objective, aux_stats = weighted_aux_losses(aux, weights)
    loss_sum, tokens = jnp.sum(nll * mask), jnp.sum(mask)
    sums = {'loss_sum': loss_sum, 'tokens': tokens,
            'objective_sum': loss_sum + aux_objective * tokens,
            'chunks': jnp.ones((), jnp.float32), **aux_stats}
    if token_bytes is not None:
      sums['bytes'] = jnp.sum(token_bytes[chunk['targets']] * mask)
    if 'subset_mask' in chunk:
      subset = mask * chunk['subset_mask'].astype(jnp.float32)
      sums.update(subset_sums(nll, chunk['targets'], subset, token_bytes))
    return (states, model_state), sums

  (memory, model_state), per_chunk = scan_chunks(one_chunk, (memory, model_state), batch,
                                                 chunk_len)
  return memory, model_state, jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), per_chunk)

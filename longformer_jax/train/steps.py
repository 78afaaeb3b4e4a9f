"""Train and eval steps of the language model and the encoder tasks (pure; the tasks jit them).

`step_arrays` turns the data pipeline's `StreamBatch` into the arrays an LM
step consumes (host side, numpy).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from longformer_jax.train.lm_objective import AUX_PREFIX, lm_sums, lm_sums_with_state
from longformer_jax.train.model_variables import ModelVariables
from longformer_jax.train.train_state import TrainState


def step_arrays(batch, pad_id: int) -> dict[str, np.ndarray]:
  """A `StreamBatch` -> `[rows, T]` numpy arrays named as `lm_objective.lm_sums` expects."""
  return dict(
      inputs=batch.inputs.astype(np.int32),
      targets=batch.targets.astype(np.int32),
      positions=batch.positions.astype(np.int32),
      segment_ids=batch.segment_ids.astype(np.int32),
      doc_start=batch.doc_start.astype(bool),
      input_mask=batch.inputs != pad_id,
      target_mask=batch.target_mask.astype(bool))


def split_rows(tree, num_micro: int, row_axis: int):
  """`[..., rows, ...]` -> `[num_micro, ..., rows / num_micro, ...]`.

  Micro-batch m takes rows m, m + k, m + 2k, ... so that on a mesh each
  device contributes rows to every micro-batch.
  """

  def split(a):
    rows = a.shape[row_axis]
    shape = a.shape[:row_axis] + (rows // num_micro, num_micro) + a.shape[row_axis + 1:]
    return jnp.moveaxis(a.reshape(shape), row_axis + 1, 0)
  return jax.tree_util.tree_map(split, tree)


def merge_rows(tree, row_axis: int):
  """Inverse of `split_rows`."""

  def merge(a):
    a = jnp.moveaxis(a, 0, row_axis + 1)
    return a.reshape(a.shape[:row_axis] + (-1,) + a.shape[row_axis + 2:])
  return jax.tree_util.tree_map(merge, tree)


def train_step(state: TrainState, batch: dict, *, model: nn.Module,
               optimizer: optax.GradientTransformation, learning_rate_fn,
               chunk_len: int, grad_accum_steps: int = 1):
  """One update: the mean next-token loss over every chunk and row of `batch`,
  plus the model's weighted auxiliary losses (`lm_objective.lm_sums`).

  With `grad_accum_steps = k` the rows are processed in k micro-batches
  (memory saving); the gradient is the same as with k = 1: each
  micro-batch's summed loss is differentiated and the sum is divided by the
  total number of target tokens.

  Returns:
    `(new_state, metrics)`; metrics are float32 scalars.
  """
  rng = jax.random.fold_in(state.rng, state.step)

  def summed_loss(params, model_state, memory, micro_batch, micro_rng):
    memory, model_state, sums = lm_sums_with_state(
        model, params, model_state, memory, micro_batch, chunk_len, rng=micro_rng,
        deterministic=False, step=state.step)
    return sums['objective_sum'], (memory, model_state, sums)

  grad_fn = jax.grad(summed_loss, has_aux=True)
  if grad_accum_steps == 1:
    grads, (memory, model_state, sums) = grad_fn(state.params, state.model_state, state.memory,
                                                 batch, rng)
  else:
    micro_batches = split_rows(batch, grad_accum_steps, row_axis=0)
    micro_memory = split_rows(state.memory, grad_accum_steps, row_axis=0)

    def accumulate(carry, xs):
      grads, model_state = carry
      memory, micro_batch, index = xs
      g, (memory, model_state, sums) = grad_fn(state.params, model_state, memory, micro_batch,
                                               jax.random.fold_in(rng, index))
      return (jax.tree_util.tree_map(jnp.add, grads, g), model_state), (memory, sums)

    zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
    (grads, model_state), (micro_memory, micro_sums) = jax.lax.scan(
        accumulate, (zeros, state.model_state),
        (micro_memory, micro_batches, jnp.arange(grad_accum_steps)))
    memory = merge_rows(micro_memory, row_axis=0)
    sums = jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), micro_sums)

  tokens = jnp.maximum(sums['tokens'], 1.0)
  grads = jax.tree_util.tree_map(lambda g: g / tokens, grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      'loss': sums['loss_sum'] / tokens,
      'tokens': sums['tokens'],
      'grad_norm': optax.global_norm(grads),
      'learning_rate': jnp.asarray(learning_rate_fn(state.step), jnp.float32),
  }
  if any(name.startswith(AUX_PREFIX) for name in sums):
    metrics['objective'] = sums['objective_sum'] / tokens
  for name, value in sums.items():
    if name.startswith(AUX_PREFIX):
      metrics[name] = value / jnp.maximum(sums['chunks'], 1.0)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            memory=memory, model_state=model_state)
  return new_state, metrics


def eval_step(params, memory, batch: dict, model_state=None, *, model: nn.Module,
              chunk_len: int, token_bytes: jax.Array):
  """Loss sums over one evaluation batch; memory carried to the next batch; the model
  state (train/train_state.py) read, not changed."""
  return lm_sums(model, params, memory, batch, chunk_len, model_state=model_state,
                 deterministic=True, token_bytes=token_bytes)


def task_train_step(state: TrainState, batch: dict, *, sums_fn, optimizer, learning_rate_fn):
  """One update of a fixed-size-example task: mean task loss plus weighted auxiliary losses.

  `sums_fn(variables, batch, rngs, deterministic)` is the task's sums (tasks/: the
  task's `sums_fn`), given the parameters and the model state as a `ModelVariables`
  that updates the state (train/model_variables.py): the updated model state (the
  Routing Transformer's centroids; `{}` for most models) goes into the new state.
  Returns `(new_state, sums + grad_norm, learning_rate)`, float32 scalars.
  """
  rng = jax.random.fold_in(state.rng, state.step)

  def objective(params):
    variables = ModelVariables(params, state.model_state, updates_state=True)
    sums = sums_fn(variables, batch, {'dropout': rng}, False)
    loss = sums['loss_sum'] / jnp.maximum(sums['count'], 1.0) + sums['aux_objective']
    return loss, (sums, variables.model_state)

  grads, (sums, model_state) = jax.grad(objective, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums)
  metrics.update(grad_norm=optax.global_norm(grads),
                 learning_rate=jnp.asarray(learning_rate_fn(state.step), jnp.float32))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                       model_state=model_state), metrics

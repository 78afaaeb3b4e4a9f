"""Scoring a fixed-size-example task's evaluation split: every example once, metrics from sums.

Used by the training loop (periodic validation of every task but lm,
tasks/example_training.py) and by eval.py (evaluation/task_report.py). Rows
of each batch are split over processes
like training rows; padding rows of the last batch have `weight` 0
(`data/task_batches.eval_batches`). `batch_shardings` and `to_global` place
a task's batches on the mesh, every array split over its leading batch axis
(the training loop's batches too).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from longformer_jax.data.task_batches import eval_batches
from longformer_jax.parallel import sharding
from longformer_jax.train.model_variables import ModelVariables
from longformer_jax.train.profiling import StepProfiler


class TaskEvaluator:
  """Scores a whole split with one compiled step of the task's sums."""

  def __init__(self, metrics_fn, sums_fn, arrays: dict, *, batch_size: int, max_examples: int,
               shardings: dict, param_shardings, mesh: jax.sharding.Mesh,
               model_state_shardings=None):
    """Compiles the eval step.

    Args:
      metrics_fn: `totals -> metrics` of the task (its `metrics`, tasks/).
      sums_fn: `(variables, batch, rngs, deterministic) -> sums` of the task, `variables`
        a `ModelVariables` (train/model_variables.py) that reads the model state.
      arrays: the split, `{name: [num_examples, ...]}`.
      batch_size: global rows per evaluation batch.
      max_examples: score the first this many examples (0: all).
      shardings: `{name: NamedSharding}` of a batch.
      param_shardings: shardings of the parameters.
      mesh: the device mesh.
      model_state_shardings: shardings of the model state (`TrainState.model_state`);
        None: replicated.
    """
    self.metrics_fn = metrics_fn
    self.arrays = arrays
    self.batch_size = batch_size
    self.max_examples = max_examples
    self.shardings = shardings
    rows = batch_size // jax.process_count()
    self.rows = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    if model_state_shardings is None:
      model_state_shardings = sharding.replicated(mesh)
    self._step = jax.jit(
        lambda params, model_state, batch: sums_fn(ModelVariables(params, model_state), batch,
                                                   {}, True),
        in_shardings=(param_shardings, model_state_shardings, shardings),
        out_shardings=sharding.replicated(mesh))

  def batches(self):
    """The global batches of the split (this process's rows of each, placed on the mesh)."""
    for batch in eval_batches(self.arrays, self.batch_size, self.max_examples):
      yield to_global({name: value[self.rows] for name, value in batch.items()}, self.shardings)

  def evaluate(self, params, model_state=None, profiler=None) -> dict:
    """The task's metrics over the split; `model_state`: the run's non-gradient model state
    (`TrainState.model_state`), read, if the model has any; `profiler`: a `StepProfiler`
    (train/profiling.py) that traces its batches."""
    profiler = profiler or StepProfiler.disabled()
    totals = None
    for number, batch in enumerate(self.batches(), start=1):
      profiler.before(number)
      with profiler.annotation(number):
        sums = self._step(params, model_state or {}, batch)
      totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
      profiler.after(number, totals)
    totals = jax.tree_util.tree_map(lambda x: float(np.asarray(x)), totals)
    return self.metrics_fn(totals)


def batch_shardings(example_batch: dict, mesh: jax.sharding.Mesh, rules) -> dict:
  """`{name: NamedSharding}`: each array of `example_batch` sharded over its `batch` axis."""
  def spec(array):
    names = ('batch',) + (None,) * (np.ndim(array) - 1)
    return NamedSharding(mesh, nn.logical_to_mesh_axes(names, sharding.rules_tuple(rules)))
  return {name: spec(value) for name, value in example_batch.items()}


def to_global(local: dict, shardings: dict) -> dict:
  """This process's rows `{name: [rows, ...]}` -> global arrays laid out by `shardings`."""
  return {name: jax.make_array_from_process_local_data(shardings[name], value)
          for name, value in local.items()}

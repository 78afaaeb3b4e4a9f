"""The train state of a fixed-size-example task (tasks/base.ExampleTask): shapes, shardings, init.

Examples are independent, so the state has no memory (`memory=()`); a model with
non-gradient state (the Flax collection `model_state`: the Routing Transformer's
centroids) keeps it in `TrainState.model_state`, created with the parameters and
in its shardings (replicated: its leaves name no logical axes); `{}` for the others.
`global_batch_example` gives zeros shaped like a global batch (for shapes
only); `abstract_task_state` the state's shapes and shardings and its jitted
initialiser.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.context import MODEL_STATE
from longformer_jax.parallel import sharding
from longformer_jax.train.train_state import TrainState


def global_batch_example(arrays: dict, batch_size: int) -> dict:
  """Zeros of a global batch of `batch_size` rows shaped like `arrays` (for shapes only)."""
  return {name: np.zeros((batch_size,) + value.shape[1:], value.dtype)
          for name, value in arrays.items()}


def abstract_task_state(model, init_arguments, optimizer, seed: int, example_batch: dict, mesh,
                        rules):
  """`(abstract, shardings, create)`: the train state's shapes and shardings, and its initialiser.

  `init_arguments(batch) -> tuple`: the model's positional arguments for a batch
  (the task's); `example_batch`: `{name: [batch, ...]}` arrays of the batch's shapes.
  """
  dummy = {name: jnp.zeros(value.shape, value.dtype) for name, value in example_batch.items()}

  def create_boxed(key):
    init_key, state_key = jax.random.split(key)
    variables = model.init({'params': init_key}, *init_arguments(dummy))
    params = variables['params']
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), memory=(), rng=state_key,
                      model_state=variables.get(MODEL_STATE, {}))

  boxed = jax.eval_shape(create_boxed, jax.random.PRNGKey(seed))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    nn.meta.unbox(boxed), shardings)
  create = jax.jit(lambda key: nn.meta.unbox(create_boxed(key)), out_shardings=shardings)
  return abstract, shardings, create

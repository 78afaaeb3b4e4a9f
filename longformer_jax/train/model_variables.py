"""A model's variables for one call of a task's sums function: parameters and model state.

A fixed-size-example task's sums function (tasks/base.py, "sums") receives a
`ModelVariables` where it used to receive the parameters, and applies its model with
`variables.apply(model, *args, rngs=rngs)` where it used to write
`model.apply({'params': params}, *args, rngs=rngs)`. The train step builds it with
`updates_state=True`: a model with non-gradient state (the Flax collection
`model_state`, train/train_state.py: the Routing Transformer's centroids) is then
applied with that collection mutable, and `variables.model_state` holds the updated
state when the sums function returns; the step stores it in the train state.
Validation and eval build it without `updates_state`: the state is read, never changed.
A model without model state is applied exactly as before, `{'params': params}` alone.
"""

from typing import Any

import flax.linen as nn

from longformer_jax.attention.context import MODEL_STATE


class ModelVariables:
  """`params` and `model_state` (`{}` if the model has none) of one sums call.

  `model_state` is the one field that changes: `apply` with `updates_state` replaces it
  by the model's updated collection (a sums function that applies its model twice
  applies the second time with the first's update, as chunks one after another). Build
  it inside the traced function that reads `model_state` back (the train step's
  objective), so the updated arrays never leave their trace.
  """

  def __init__(self, params: Any, model_state: Any = None, *, updates_state: bool = False):
    self.params = params
    self.model_state = model_state or {}
    self.updates_state = updates_state

  def apply(self, model: nn.Module, *args, **kwargs):
    """`model.apply` of these variables (`args`, `kwargs` as there); returns the model's
    outputs only (the updated model state goes to `self.model_state`)."""
    if not self.model_state:
      return model.apply({'params': self.params}, *args, **kwargs)
    variables = {'params': self.params, MODEL_STATE: self.model_state}
    if not self.updates_state:
      return model.apply(variables, *args, **kwargs)
    outputs, updated = model.apply(variables, *args, mutable=[MODEL_STATE], **kwargs)
    self.model_state = updated[MODEL_STATE]
    return outputs

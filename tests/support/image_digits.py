"""The image task's digits config (configs/image_digits.py) with a tiny model, resolved, and that
model on a batch of digits (the `tiny_model` fixture of tests/conftest.py)."""

import copy

import jax
import jax.numpy as jnp
import ml_collections

from configs import image_digits
from longformer_jax.data import image_data
from longformer_jax.experiment_config import resolve_config
from longformer_jax.tasks.image import TASK as IMAGE
from longformer_jax.train.model_variables import ModelVariables

TINY_MODEL = {'num_layers': 2, 'd_model': 32, 'num_heads': 2, 'head_dim': 16, 'd_ff': 64,
              'dropout_rate': 0.0}


def digits_config(layout: str = '2d', **train) -> ml_collections.ConfigDict:
  """configs/image_digits.py with a tiny model, resolved as train.py does."""
  values = copy.deepcopy(image_digits.get_config(layout))
  values['model'].update(TINY_MODEL)
  values['data'].update(batch_size=8, eval_batch_size=8)
  values['train'].update(train)
  return ml_collections.ConfigDict(resolve_config(values))


def tiny_digits_model() -> tuple:
  """The local 2D digits model and 8 valid digits: `(model, params, batch, sums_fn)`, the
  task's loss sums jitted."""
  config = digits_config('2d')
  config.data.max_examples = 8
  arrays = image_data.load_arrays(config, 'valid')
  batch = {name: jnp.asarray(value) for name, value in arrays.items()}
  _, model = IMAGE.model(config, 0)
  params = model.init(jax.random.PRNGKey(0), *IMAGE.init_arguments(batch))
  sums_fn = jax.jit(lambda p, b: IMAGE.sums_fn(config, model)(ModelVariables(p), b, {}, True))
  return model, params['params'], batch, sums_fn

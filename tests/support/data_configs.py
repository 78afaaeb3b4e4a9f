"""The data section of configs/default.py with overrides, resolved as train.py resolves it."""

import ml_collections

from configs import default
from longformer_jax.experiment_config import resolve_config


def data_config(**overrides) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(resolve_config(default.get_config())).data
  config.update(overrides)
  return config

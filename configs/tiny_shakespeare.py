"""Byte-level Transformer-XL on tiny_shakespeare (tfds; prepare it first:
`tfds build tiny_shakespeare --data_dir=DIR`, then pass
`--config.data.tfds_data_dir=DIR`). Its one document per split is cut into
one piece per training row."""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      # --config.data.tfds_data_dir=DIR on the command line
      'data': {'corpus': 'tiny_shakespeare',
               'eval_batch_size': 1},    # the validation split is one document
  })

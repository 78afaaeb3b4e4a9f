"""Byte-level Transformer-XL on tiny_shakespeare (tfds; prepare it first:
`tfds build tiny_shakespeare --data_dir=DIR`, then pass
`--config.data.tfds_data_dir=DIR`). Its one document per split is cut into
one piece per training row."""

from configs import default


def get_config():
  config = default.get_config()
  config.data.corpus = 'tiny_shakespeare'
  config.data.tfds_data_dir = ''   # set on the command line
  config.data.batch_size = 8
  config.data.eval_batch_size = 1  # the validation split is one document
  return config

"""The data section of a `passkey` corpus, built and checked as a config's section is."""

import ml_collections

from longformer_jax.data.data_config import DataConfig


def passkey_data(chunk_len: int, **settings):
  return ml_collections.ConfigDict(DataConfig.build(
      dict(corpus='passkey', chunk_len=chunk_len, **settings), 'config.data').to_dict())

"""StreamingLLM attention sinks (Xiao et al., 2023) on PG-19, for a TPU pod slice.

The model of configs/pg19_xl.py with every layer attending to the first 4
tokens of its document and its 1024 most recent tokens, RoPE positions
counted inside that cache as in the paper (configs/streaming_llm.py with a
longer window).

Prepare the data and a tokenizer first (see configs/pg19_xl.py), then
  python train.py --config=configs/pg19_streaming_llm.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model
  python eval.py --workdir=$WORKDIR --config.eval.split=test
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {
          'attention': 'streaming_sinks',
          'mem_len': 0,                              # the layer keeps its own cache
          'streaming_sinks': {'window': 1024},       # most recent tokens seen by each query
      },
      'eval': {'mem_lens': ''},                      # no cache of hidden states to sweep
  })

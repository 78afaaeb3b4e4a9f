"""StreamingLLM attention sinks (Xiao et al., 2023) on PG-19, for a TPU pod slice.

The model of configs/pg19_xl.py with every layer attending to the first 4
tokens of its document and its 1024 most recent tokens, RoPE positions
counted inside that cache as in the paper.

Prepare the data and a tokenizer first (see configs/pg19_xl.py), then
  python train.py --config=configs/pg19_streaming_llm.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model
  python eval.py --workdir=$WORKDIR --config.eval.split=test
"""

from configs import pg19_xl, streaming_llm


def get_config():
  config = pg19_xl.get_config()
  sinks = streaming_llm.get_config().model
  config.model.attention = 'streaming_sinks'
  config.model.mem_len = 0
  for key in ('num_sinks', 'sink_positions'):
    config.model[key] = sinks[key]
  config.model.sink_window = 1024
  config.eval.mem_lens = ''
  return config

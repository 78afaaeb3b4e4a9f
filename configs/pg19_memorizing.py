"""Memorizing Transformer on PG-19 for a TPU pod slice (Wu et al., 2022, section 4).

The paper's PG-19 setup: 12 layers, d_model 1024, 8 heads of 128, segments
of 512 tokens with a 512-token cache, a kNN memory in layer 9 with top-32
retrieval; with an 8K memory it reports 11.93 token perplexity (XL cache
only: 12.34). Approximate top-k (`lax.approx_max_k`) is fast on TPU.
Memory: 8192 entries x 8 heads x 128 x (key, value) in bfloat16 is 32 MiB
per row, 2 GiB for 64 rows, sharded over the batch; it is part of every
checkpoint (docs/design.md, contract 4).

Prepare the data and a tokenizer first (see README and configs/pg19_xl.py), then
  python train.py --config=configs/pg19_memorizing.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model
  python eval.py --workdir=$WORKDIR --config.eval.split=test
"""

from configs import memorizing, pg19_xl


def get_config():
  config = pg19_xl.get_config()
  knn = memorizing.get_config().model
  config.model.update(num_layers=12, d_model=1024, num_heads=8, head_dim=128, d_ff=4096,
                      attention='vanilla', mem_len=512,
                      scan_layers=False)             # a layer_schedule makes layers differ
  config.model.layer_schedule.attention = ','.join(
      'memorizing' if i == 8 else 'vanilla' for i in range(12))
  for key in ('knn_gate', 'knn_gate_value', 'knn_normalize_qk', 'knn_qk_scale_init',
              'rope_max_distance', 'knn_recall_target'):
    config.model[key] = knn[key]
  config.model.knn_memory_size = 8192
  config.model.knn_top_k = 32
  config.model.knn_method = 'approx'
  config.eval.mem_lens = ''
  return config

"""Memorizing Transformer on PG-19 for a TPU pod slice (Wu et al., 2022, section 4).

The paper's PG-19 setup: 12 layers, d_model 1024, 8 heads of 128, segments
of 512 tokens with a 512-token cache, a kNN memory in layer 9 with top-32
retrieval (the default `model.memorizing.top_k`); with an 8K memory it
reports 11.93 token perplexity (XL cache only: 12.34). Approximate top-k
(`lax.approx_max_k`) is fast on TPU. The gate and normalisation are those of
configs/memorizing.py. Memory: 8192 entries x 8 heads x 128 x (key, value)
in bfloat16 is 32 MiB per row, 2 GiB for 64 rows, sharded over the batch; it
is part of every checkpoint (docs/design.md, contract 4).

Prepare the data and a tokenizer first (see docs/training.md and configs/pg19_xl.py), then
  python train.py --config=configs/pg19_memorizing.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model
  python eval.py --workdir=$WORKDIR --config.eval.split=test
"""

from configs import memorizing, pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  knn = memorizing.get_config()['model']['memorizing']
  return merged(pg19_xl.get_config(), {
      'model': {
          'num_layers': 12, 'd_model': 1024, 'num_heads': 8, 'head_dim': 128, 'd_ff': 4096,
          'attention': 'vanilla',
          'mem_len': 512,
          'scan_layers': False,          # a layer_schedule makes layers differ
          'layer_schedule': {'attention': ','.join(
              'memorizing' if i == 8 else 'vanilla' for i in range(12))},
          'memorizing': merged(knn, {
              'memory_size': 8192,       # (key, value) entries per row
              'method': 'approx',        # lax.approx_max_k (recall_target 0.95)
          }),
      },
      'eval': {'mem_lens': ''},          # the training cache only
  })

"""Transformer-XL on PG-19 for a TPU pod slice (cf. Rae et al., 2019, table 3).

Prepare the data and a tokenizer first (see docs/training.md, "Data"):
  tfds build pg19 --data_dir=$DATA
  python -m longformer_jax.data.sentencepiece_tokenizer --corpus=pg19 \
      --tfds_data_dir=$DATA --vocab_size=32000 --out=$DATA/spm32k
then
  python train.py --config=configs/pg19_xl.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'data': {'corpus': 'pg19', 'tokenizer': 'sentencepiece', 'batch_size': 64,
               'eval_batch_size': 64, 'chunk_len': 512},
      'model': {'num_layers': 16, 'd_model': 1024, 'num_heads': 16,
                'd_ff': 4096, 'dropout_rate': 0.1, 'mem_len': 512, 'dtype': 'bfloat16',
                'vocab_multiple': 128, 'scan_layers': True, 'remat_policy': 'dots_no_batch',
                'tie_embeddings': False},
      'optimizer': {'learning_rate': 3e-4, 'warmup_steps': 4000},
      'train': {'num_steps': 500_000, 'log_every': 100, 'eval_every': 5000,
                'eval_max_tokens': 2_000_000, 'checkpoint_every': 2000},
      # FSDP over all chips of the slice; add a tensor axis for bigger models.
      'parallel': {'mesh_shape': (1, -1, 1)},
      'eval': {'mem_lens': '512,1024,2048'},
  })

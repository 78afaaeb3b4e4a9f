"""Model widths, slices and data of the pod plans (configs/pod_xl.py, pod_longformer.py,
pod_bigbird.py).

Widths of the two sizes (parameters with a 32,000-piece vocabulary, untied embeddings;
docs/scaling.md, "Pod plans", has each plan's count):

| size | layers | d_model | heads x head_dim | d_ff |
|---|---:|---:|---:|---:|
| 1b | 20 | 2,048 | 16 x 128 | 8,192 |
| 8b | 36 | 4,096 | 32 x 128 | 16,384 |

Slices: `v5p128` (TPU v5p-128: 128 TensorCores, 64 chips, one JAX device per chip,
95 GB of HBM each) and `v5e256` (TPU v5e-256: 256 chips of 16 GB). Data: PG-19 with a
SentencePiece vocabulary of 32,000 (configs/pg19_xl.py says how to build both). Each plan's
`parallel` section is its mesh alone: the default logical axis rules
(parallel/parallel_config.py) shard the parameters' `embed` axis over `fsdp` and `sequence`
together, so a sequence axis shares the state as fsdp does (docs/scaling.md, "Pod plans").

Run a plan on its slice (every worker the same command):

  python train.py --config=configs/pod_xl.py:1b_v5p128 --workdir=$WORKDIR \\
      --config.parallel.multi_host=True \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model

Check what it needs per chip, on any machine (docs/scaling.md, "Pod plans"):

  python -m benchmarks.pod_plans --plans=xl_1b_v5p128
"""

from longformer_jax.config.errors import require

SIZES = {
    '1b': {'num_layers': 20, 'd_model': 2048, 'num_heads': 16, 'head_dim': 128, 'd_ff': 8192},
    '8b': {'num_layers': 36, 'd_model': 4096, 'num_heads': 32, 'head_dim': 128, 'd_ff': 16384},
}
# One JAX device per chip; HBM and the bfloat16 peak per chip, as Google's TPU pages give them.
SLICES = {
    'v5p128': {'chip': 'TPU v5p', 'devices': 64, 'hbm_bytes': 95e9, 'peak_bf16_flops': 459e12},
    'v5e256': {'chip': 'TPU v5e', 'devices': 256, 'hbm_bytes': 16e9, 'peak_bf16_flops': 197e12},
}
VOCAB_SIZE = 32000


def model(size: str) -> dict:
  """The `model` section shared by every plan of `size`: bfloat16, scanned layers."""
  return {**SIZES[size], 'dtype': 'bfloat16', 'scan_layers': True, 'vocab_multiple': 128,
          'tie_embeddings': False, 'dropout_rate': 0.0}


def data(batch_size: int, chunk_len: int, chunks_per_step: int = 1) -> dict:
  return {'corpus': 'pg19', 'tokenizer': 'sentencepiece', 'batch_size': batch_size,
          'eval_batch_size': batch_size, 'chunk_len': chunk_len,
          'chunks_per_step': chunks_per_step}


def parse(arg: str, plans: dict, config_file: str) -> dict:
  """The plan named `arg` in `plans`; a one-line error naming the choices otherwise."""
  require(arg in plans, '--config', f'{config_file}:{arg}: unknown plan; use one of '
          f'{", ".join(plans)}')
  return plans[arg]


def training() -> dict:
  return {'optimizer': {'learning_rate': 3e-4, 'warmup_steps': 2000},
          'train': {'num_steps': 100_000, 'log_every': 50, 'eval_every': 5000,
                    'eval_max_tokens': 2_000_000, 'checkpoint_every': 1000}}

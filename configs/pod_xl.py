"""Transformer-XL at 1B and 8B parameters on a TPU pod slice: 32,768 tokens per row and step.

Each row of a step is 4 chunks of 8,192 tokens with a memory of 2,048 hidden states per
layer (the chunks scanned and backpropagated through, the memory carried to the next step),
bfloat16, scanned layers, the state sharded over `fsdp`. The plan after the colon is the
size and the slice (configs/pod_sizes.py):

| plan | mesh (data, fsdp, tensor) | rows per step | remat |
|---|---|---:|---|
| 1b_v5p128 | (1, 64, 1) | 64 | full |
| 1b_v5e256 | (1, 256, 1) | 256 | full |
| 8b_v5p128 | (1, 64, 1) | 64 | full |
| 8b_v5e256 | (1, 64, 4) | 64 | full |

Run on the slice (every worker the same command; PG-19 and its tokenizer as in
configs/pg19_xl.py):

  python train.py --config=configs/pod_xl.py:1b_v5p128 --workdir=$WORKDIR \\
      --config.parallel.multi_host=True \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model

Check what it needs per chip, on any machine (docs/scaling.md, "Pod plans"):

  python -m benchmarks.pod_plans --plans=xl_1b_v5p128
"""

from configs import pod_sizes
from longformer_jax.config.overrides import merged

CHUNK = 8192
CHUNKS_PER_STEP = 4
MEMORY = 2048
PLANS = {
    '1b_v5p128': {'size': '1b', 'mesh': (1, 64, 1), 'rows': 64, 'remat': 'full'},
    '1b_v5e256': {'size': '1b', 'mesh': (1, 256, 1), 'rows': 256, 'remat': 'full'},
    '8b_v5p128': {'size': '8b', 'mesh': (1, 64, 1), 'rows': 64, 'remat': 'full'},
    '8b_v5e256': {'size': '8b', 'mesh': (1, 64, 4), 'rows': 64, 'remat': 'full'},
}


def get_config(arg: str = '1b_v5p128') -> dict:
  plan = pod_sizes.parse(arg, PLANS, 'pod_xl.py')
  return merged(pod_sizes.training(), {
      'model': {**pod_sizes.model(plan['size']), 'attention': 'xl', 'mem_len': MEMORY,
                'remat_policy': plan['remat']},
      'data': pod_sizes.data(plan['rows'], CHUNK, CHUNKS_PER_STEP),
      'parallel': {'mesh_shape': plan['mesh']},
      'eval': {'mem_lens': str(MEMORY)},
  })

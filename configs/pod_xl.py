"""Transformer-XL at 1B and 8B parameters on a TPU pod slice: 32,768 tokens per row and step.

Each row of a step is 32,768 tokens: 4 chunks of 8,192 (8 of 4,096 for the 8B model on a
v5e) with a memory of 2,048 hidden states per layer (the chunks scanned and backpropagated
through, the memory carried to the next step), bfloat16, scanned layers, every activation
recomputed in the backward pass (`remat_policy='full'`), the state sharded over `fsdp`
(and `sequence`: the default rules, parallel/parallel_config.py). The plan after the colon is the size
and the slice (configs/pod_sizes.py); the meshes are the ones docs/scaling.md ("Pod plans")
found to fit with 10% of the HBM to spare:

| plan | mesh (data, fsdp, tensor, sequence) | rows per step | chunks per row |
|---|---|---:|---|
| 1b_v5p128 | (1, 64, 1, 1) | 64 | 4 x 8,192 |
| 1b_v5e256 | (1, 64, 1, 4) | 64 | 4 x 8,192 |
| 8b_v5p128 | (1, 32, 1, 2) | 32 | 4 x 8,192 |
| 8b_v5e256 | (1, 16, 4, 4) | 16 | 8 x 4,096 |

Run it on its slice, and check it on any machine, as configs/pod_sizes.py says (e.g.
`--config=configs/pod_xl.py:1b_v5p128`, `--plans=xl_1b_v5p128`).
"""

from configs import pod_sizes
from longformer_jax.config.overrides import merged

ROW = 32768
MEMORY = 2048
PLANS = {
    '1b_v5p128': {'size': '1b', 'mesh': (1, 64, 1, 1), 'rows': 64, 'chunk': 8192},
    '1b_v5e256': {'size': '1b', 'mesh': (1, 64, 1, 4), 'rows': 64, 'chunk': 8192},
    '8b_v5p128': {'size': '8b', 'mesh': (1, 32, 1, 2), 'rows': 32, 'chunk': 8192},
    '8b_v5e256': {'size': '8b', 'mesh': (1, 16, 4, 4), 'rows': 16, 'chunk': 4096},
}


def get_config(arg: str = '1b_v5p128') -> dict:
  plan = pod_sizes.parse(arg, PLANS, 'pod_xl.py')
  return merged(pod_sizes.training(), {
      'model': {**pod_sizes.model(plan['size']), 'attention': 'xl', 'mem_len': MEMORY,
                'remat_policy': 'full'},
      'data': pod_sizes.data(plan['rows'], plan['chunk'], ROW // plan['chunk']),
      'parallel': {'mesh_shape': plan['mesh']},
      'eval': {'mem_lens': str(MEMORY)},
  })

"""Longformer at 1B and 8B parameters on a TPU pod slice: 32,768 or 131,072 tokens per row.

A causal LM whose every layer attends a one-sided window of 512 tokens (513 keys) within a
chunk that is the whole row: no window cache (`window_cache=False`), one chunk per step,
no global tokens (the paper's LM has none). At 131,072 tokens the chunk is split over a
`sequence` axis of 4 (docs/scaling.md, "Sliding window": each device exchanges a halo of
512 tokens with its neighbour). bfloat16, scanned layers, every activation recomputed in
the backward pass (`remat_policy='full'`), the state sharded over `fsdp` (and `sequence`, the
default rules of parallel/parallel_config.py; `tensor` splits heads and the feed-forward). The plan after
the colon is the size, the row length and the slice (configs/pod_sizes.py); the meshes are
the ones docs/scaling.md ("Pod plans") found to fit with 10% of the HBM to spare:

| plan | mesh (data, fsdp, tensor, sequence) | rows per step | tokens per chip |
|---|---|---:|---:|
| 1b_32k_v5p128 | (1, 64, 1, 1) | 64 | 32,768 |
| 1b_32k_v5e256 | (1, 64, 1, 4) | 64 | 8,192 |
| 1b_131k_v5p128 | (1, 16, 1, 4) | 16 | 32,768 |
| 1b_131k_v5e256 | (1, 16, 1, 16) | 16 | 8,192 |
| 8b_32k_v5p128 | (1, 64, 1, 1) | 64 | 32,768 |
| 8b_32k_v5e256 | (1, 16, 4, 4) | 16 | 8,192 |
| 8b_131k_v5p128 | (1, 16, 1, 4) | 16 | 32,768 |
| 8b_131k_v5e256 | (1, 4, 4, 16) | 4 | 8,192 |

configs/pod_bigbird.py has BigBird at the 1B size on the same meshes.

Run it on its slice, and check it on any machine, as configs/pod_sizes.py says (e.g.
`--config=configs/pod_longformer.py:1b_131k_v5p128`, `--plans=longformer_1b_131k_v5p128`).
"""

from configs import pod_sizes
from longformer_jax.config.overrides import merged

WINDOW = 512
LENGTHS = {'32k': 32768, '131k': 131072}
PLANS = {
    '1b_32k_v5p128': {'mesh': (1, 64, 1, 1), 'rows': 64},
    '1b_32k_v5e256': {'mesh': (1, 64, 1, 4), 'rows': 64},
    '1b_131k_v5p128': {'mesh': (1, 16, 1, 4), 'rows': 16},
    '1b_131k_v5e256': {'mesh': (1, 16, 1, 16), 'rows': 16},
    '8b_32k_v5p128': {'mesh': (1, 64, 1, 1), 'rows': 64},
    '8b_32k_v5e256': {'mesh': (1, 16, 4, 4), 'rows': 16},
    '8b_131k_v5p128': {'mesh': (1, 16, 1, 4), 'rows': 16},
    '8b_131k_v5e256': {'mesh': (1, 4, 4, 16), 'rows': 4},
}


def get_config(arg: str = '1b_131k_v5p128') -> dict:
  plan = pod_sizes.parse(arg, PLANS, 'pod_longformer.py')
  size, length, _ = arg.split('_')
  return merged(pod_sizes.training(), {
      'model': {**pod_sizes.model(size), 'attention': 'longformer', 'mem_len': 0,
                'remat_policy': 'full',
                'longformer': {'window': WINDOW, 'window_cache': False}},
      'data': pod_sizes.data(plan['rows'], LENGTHS[length]),
      'parallel': {'mesh_shape': plan['mesh']},
  })

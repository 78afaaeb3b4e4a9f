"""BigBird at 1B parameters on a TPU pod slice: 32,768 tokens per row.

A causal LM of BigBird's block-sparse attention (Zaheer et al., 2020) in blocks of 64: each
query block sees its own and the previous block, 2 random past blocks and the first block
(the defaults of `model.bigbird` but the block), within a chunk that is the whole row, one
chunk per step; bfloat16, scanned layers, `remat_policy='full'`, the 1B widths of
configs/pod_sizes.py:

| plan | mesh (data, fsdp, tensor, sequence) | rows per step |
|---|---|---:|
| 1b_32k_v5p128 | (1, 64, 1, 1) | 64 |
| 1b_32k_v5e256 | (1, 64, 4, 1) | 64 |

BigBird has no sequence-parallel path, so every chip holds a whole row of 32,768 tokens; on
the v5e a tensor axis of 4 splits the heads, the feed-forward and the logits' vocabulary
(a whole row over 256 chips of fsdp needs 17.75 GB a chip, docs/scaling.md). Run on the
slice, and check it on any machine, as configs/pod_sizes.py says (e.g.
`--config=configs/pod_bigbird.py:1b_32k_v5p128`, `--plans=bigbird_1b_32k_v5p128`).
"""

from configs import pod_sizes
from longformer_jax.config.overrides import merged

LENGTH = 32768
BLOCK = 64
PLANS = {
    '1b_32k_v5p128': {'mesh': (1, 64, 1, 1), 'rows': 64},
    '1b_32k_v5e256': {'mesh': (1, 64, 4, 1), 'rows': 64},
}


def get_config(arg: str = '1b_32k_v5p128') -> dict:
  plan = pod_sizes.parse(arg, PLANS, 'pod_bigbird.py')
  return merged(pod_sizes.training(), {
      'model': {**pod_sizes.model('1b'), 'attention': 'bigbird', 'mem_len': 0,
                'remat_policy': 'full', 'bigbird': {'block': BLOCK}},
      'data': pod_sizes.data(plan['rows'], LENGTH),
      'parallel': {'mesh_shape': plan['mesh']},
  })

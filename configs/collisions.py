"""Object collisions (the Expire-Span paper's task) in miniature (docs/collisions.md).

Episodes of 512 steps on an 8x8 grid, two particles, 3 colours (`data.corpus='collisions'`,
longformer_jax/data/collisions.py): 9 byte tokens per step, 4,608 per episode, a collision
every ~60 steps. Every step asks where a colour pair last collided; the loss counts the
labelled answers alone (`data.loss_on='answer'`), and the model reads every answer as a
blank. The episodes are read in 64-token chunks with the memory carried from chunk to chunk
(reset at each episode), so a collision more than chunk + memory tokens back is answerable
only from what the memory chose to keep.

  python train.py --config=configs/collisions.py:expire_span --workdir=workdirs/collisions_es
  python -m benchmarks.collision_accuracy --workdir=workdirs/collisions_es

(docs/collisions.md has the smaller worlds, `data.collisions.grid_size` / `num_colors`, and
the denser loss, `data.loss_on=all`, that its runs add on the command line.)

| choice | the memory |
|---|---|
| expire_span | Expire-Span with the authors' collision recipe: spans up to 4,096, ramp 128, initial spans 0.01 of the largest, pre-division 64, the penalty on the ramp at 2e-6, random shortening; capacity 1,024 |
| xl | Transformer-XL cache of the last 256 hidden states per layer |
| none | no memory: each 64-token chunk alone |

The model is byte level, 2 layers, d_model 128, 4 heads of 32, relative positions.
"""

from configs import default
from longformer_jax.config.errors import require
from longformer_jax.config.overrides import merged

CHUNK = 64
MEMORIES = {
    'expire_span': {'attention': 'expire_span', 'mem_len': 1024,
                    'expire_span': {'max_span': 4096, 'ramp': 128, 'pre_div': 64.0,
                                    'loss': 'ramp', 'shorten': True, 'init_fraction': 0.01},
                    'aux_loss_weights': {'expire_span_loss': 2e-6}},
    'xl': {'attention': 'xl', 'mem_len': 256},
    'none': {'attention': 'xl', 'mem_len': 0},
}


def get_config(arg: str = 'expire_span') -> dict:
  require(arg in MEMORIES, '--config', f'collisions.py:{arg}: unknown memory; use one of '
          f'{", ".join(MEMORIES)}')
  return merged(default.model_config(), {
      'model': {'num_layers': 2, 'd_model': 128, 'num_heads': 4, 'head_dim': 32,
                'd_ff': 512, **MEMORIES[arg]},
      'data': {'corpus': 'collisions', 'loss_on': 'answer', 'chunk_len': CHUNK,
               'batch_size': 8},
      'train': {'num_steps': 2000, 'eval_every': 1000, 'checkpoint_every': 500,
                'eval_max_tokens': 16384},
      'eval': {'split': 'test', 'chunk_len': CHUNK},
  })

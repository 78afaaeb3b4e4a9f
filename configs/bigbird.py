"""BigBird (Zaheer et al., 2020) block-sparse attention as a byte-level LM on the built-in corpus.

BigBird is an encoder (bidirectional); this LM config sets `model.causal =
True`, which keeps the same block pattern (window, random and ITC global
blocks) under a causal mask and draws random blocks among past blocks only.
Encoder models (models/encoder.py, which pass causal=False) use the
bidirectional pattern with the same keys, and global tokens from
ctx.global_flags up to `bigbird_max_global_tokens`.

The default's chunks of 256 bytes in blocks of 16: each query sees its own
and the previous block (the next one too when bidirectional), 2 random blocks
and the first block (global), at most 80 of 256 keys. Each layer's random blocks come from
fold_in(PRNGKey(bigbird_seed), layer_index), the layer's number (set by
the stack, models/layer_schedule.layer_config); train and eval draw the
same pattern.

  python train.py --config=configs/bigbird.py --workdir=workdirs/bigbird
  python eval.py  --config=configs/bigbird.py --workdir=workdirs/bigbird

Data, size and budget as configs/default.py (compare with configs/vanilla.py).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.model.attention = 'bigbird'
  c.model.causal = True               # LM; encoders use causal=False
  c.model.mem_len = 0                 # stateless: attends within the chunk
  c.model.bigbird_block = 16
  c.model.bigbird_window_blocks = 1   # blocks on each side
  c.model.bigbird_random_blocks = 2
  c.model.bigbird_global_blocks = 1   # ITC: the chunk's first block is global
  c.model.bigbird_max_global_tokens = 0   # tokens flagged in ctx.global_flags (encoders)
  c.model.bigbird_seed = 0
  return c

"""BigBird (Zaheer et al., 2020) block-sparse attention as a byte-level LM on the built-in corpus.

BigBird is an encoder (bidirectional); this LM keeps the shared `model.causal
= True` (the default), which applies the same block pattern (window, random
and ITC global blocks) under a causal mask and draws random blocks among past
blocks only. Encoder models (models/encoder.py, which pass causal=False) use
the bidirectional pattern with the same keys, and global tokens from
ctx.global_flags up to `model.bigbird.max_global_tokens`.

Every BigBird setting is the default of `model.bigbird`: the default's
chunks of 256 bytes in blocks of 16 (`block`); each query sees its own and
the previous block (`window_blocks` = 1 on each side; the next one too when
bidirectional), `random_blocks` = 2 random blocks and the first block
(`global_blocks` = 1, ITC), at most 80 of 256 keys. Each layer's random
blocks come from fold_in(PRNGKey(seed), layer_index), the layer's number
(set by the stack, models/layer_schedule.layer_config); train and eval draw
the same pattern as long as they use chunks with the same number of blocks
(the config is refused otherwise).

  python train.py --config=configs/bigbird.py --workdir=workdirs/bigbird
  python eval.py  --config=configs/bigbird.py --workdir=workdirs/bigbird

Data and size as configs/default.py, 900 steps (the train section default) (compare with configs/vanilla.py).
"""


def get_config() -> dict:
  return {'model': {'attention': 'bigbird'}}   # stateless: attends within the chunk

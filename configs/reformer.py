"""Reformer: LSH attention, reversible layers, chunked feed-forward (Kitaev et al., 2020).

The default model's size and data with the Reformer's three pieces:
`model.attention='lsh'` (shared-QK attention within hash buckets, sorted
and chunked; stateless, so `mem_len=0`), `model.stack='reversible'`
(activation memory for backward independent of depth) and
`model.ff_chunk_size` (the feed-forward a chunk of positions at a time).
Chunks of 1024 tokens, 16 buckets of about 64 tokens, 2 hash rounds.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.data.chunk_len = 1024
  config.data.batch_size = 2
  config.data.eval_batch_size = 2
  config.model.attention = 'lsh'
  config.model.stack = 'reversible'
  config.model.mem_len = 0
  config.model.lsh_num_hashes = 2      # hash rounds (n_rounds); 4-8 in the paper's best runs
  config.model.lsh_num_buckets = 16    # ~ chunk_len / lsh_chunk_len buckets per round
  config.model.lsh_chunk_len = 64      # m: a query sees its bucket in its own and the previous chunk
  config.model.lsh_seed = 0            # fixed rotations per layer from this seed
  config.model.lsh_rotations_per_step = False  # True: fresh rotations each step (eval stays fixed)
  config.model.lsh_rotary = True       # RoPE on the shared QK vectors
  config.model.ff_chunk_size = 256     # feed-forward over 256 positions at a time
  return config

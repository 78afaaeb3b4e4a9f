"""Reformer: LSH attention, reversible layers, chunked feed-forward (Kitaev et al., 2020).

The default model's size and data with the Reformer's three pieces:
`model.attention='lsh'` (shared-QK attention within hash buckets, sorted
and chunked; stateless), `model.stack='reversible'` (activation memory for
backward independent of depth) and `model.ff_chunk_size` (the feed-forward a
chunk of positions at a time). Chunks of 1024 tokens, 16 buckets of about 64
tokens, 2 hash rounds (`model.lsh.num_hashes`, the default; 4-8 in the
paper's best runs), fixed rotations per layer from `lsh.seed` = 0 and RoPE
on the shared QK vectors (`lsh.rotary`).
"""


def get_config() -> dict:
  return {
      'data': {'chunk_len': 1024, 'batch_size': 2, 'eval_batch_size': 2},
      'model': {
          'attention': 'lsh',
          'stack': 'reversible',
          'ff_chunk_size': 256,            # feed-forward over 256 positions at a time
          # ~ data.chunk_len / lsh.chunk_len (64, the default) buckets per round
          'lsh': {'num_buckets': 16},
      },
  }

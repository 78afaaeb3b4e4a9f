"""Attendre attention (Yang & Hua et al., 2024) trained in a decoder LM on the built-in corpus.

Every layer attends to a K/V memory of 256 entries kept by the LRA-max
eviction policy (least recently attended: the attention the chunk's queries
gave each entry, max over the queries, summed over heads) plus its causal
chunk. In a decoder the Q memory stays empty (`model.attendre.q_memory_size`
0, the default): delayed queries would see the tokens they predict. The
other settings of `model.attendre` keep their defaults: new entries score
mean - 1 * std (`init_std_multiplier`), attention to every memory entry
(`top_k` 0), plain RoPE (`rope_max_distance` -1); causal (the shared
`model.causal`). Bidirectional use (an encoder, or a decoder's prompt) sets
`causal=False`, `q_memory_size > 0` and `stack='attendre_delay'`
(models/attendre_delay.py).

  python train.py --config=configs/attendre.py --workdir=workdirs/attendre
  python eval.py --config=configs/attendre.py --workdir=workdirs/attendre \\
      --config.eval.memory_sweep='variant=attendre;policy=fifo,lra_max,lfa;memory_size=128,256,512'
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.get_config(), {
      'model': {
          'attention': 'attendre',
          'mem_len': 0,                  # Attendre keeps no cache of hidden states
          'attendre': {
              'memory_size': 256,        # M: K/V memory entries per layer and row
              'policy': 'lra_max',       # fifo | sink | lru | lfu | lra_{last,max,sum} | lfa
          },
      },
      'data': {'chunk_len': 128},
  })

"""Attendre attention (Yang & Hua et al., 2024) trained in a decoder LM on the built-in corpus.

Every layer attends to a K/V memory of 256 entries kept by the LRA-max
eviction policy (least recently attended: the attention the chunk's queries
gave each entry, max over the queries, summed over heads) plus its causal
chunk. In a decoder the Q memory stays empty (`q_memory_size = 0`): delayed
queries would see the tokens they predict. Bidirectional use (an encoder, or
a decoder's prompt) sets `causal=False`, `q_memory_size > 0` and
`stack='attendre_delay'` (models/attendre_delay.py).

  python train.py --config=configs/attendre.py --workdir=workdirs/attendre
  python eval.py --config=configs/attendre.py --workdir=workdirs/attendre \\
      --config.eval.memory_sweep='variant=attendre;policy=fifo,lra_max,lfa;memory_size=128,256,512'
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'attendre'
  config.model.mem_len = 0
  config.model.memory_size = 256           # M: K/V memory entries per layer and row
  config.model.q_memory_size = 0           # N: delayed queries (0 in a decoder LM)
  config.model.memory_policy = 'lra_max'   # fifo | lru | lfu | lra_{last,max,sum} | lfa | sink
  config.model.lfa_gamma = 1.0             # lfa decay (1: LFA-0)
  config.model.num_sinks = 4               # sink policy: first tokens kept
  config.model.init_std_multiplier = 1.0   # new entries score mean - k * std
  config.model.memory_top_k = 0            # 0: attend to every entry; k: top-k per query/head
  config.model.memory_top_k_method = 'exact'   # exact | approx (lax.approx_max_k)
  config.model.rope_max_distance = -1      # LM-Infinite cap on RoPE distances (-1: off)
  config.model.causal = True
  config.data.chunk_len = 128
  config.eval.memory_sweep = ''
  return config

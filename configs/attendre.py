"""Attendre attention (Yang & Hua et al., 2024) trained in a decoder LM on the built-in corpus.

The paper's order (`model.attendre.order='insert_first'`, Figure 1): each
chunk's keys and values are first inserted into every layer's K/V memory of
256 entries kept by the LRA-max eviction policy (least recently attended:
the attention each entry received, max over the queries that may see it,
summed over heads), new entries competing with the memory's on their
initial score, mean - 1 * std (`admission='score'`, `init_std_multiplier`);
the chunk's queries then attend to the memory alone (at most 256 keys, the
chunk's own as far as they were kept). `order='attend_first'` (the section's
default) attends to [memory; chunk] and inserts afterwards, as runs made
before this setting existed did. With `admission='score'` a chunk's own
tokens must outscore stored entries to be seen at all: this run trains with
that, but given to a model trained without it at evaluation time the pair
lost the local context (docs/variants.md, "Attendre"; keep a
`recent_window`). In a decoder the Q memory stays empty
(`model.attendre.q_memory_size` 0, the default): delayed queries would see
the tokens they predict. A memory sweep of this run keeps its order. The other settings of `model.attendre` keep their
defaults: attention to every memory entry (`top_k` 0), plain RoPE
(`rope_max_distance` -1); causal (the shared `model.causal`). Bidirectional
use (an encoder, or a decoder's prompt) sets `causal=False`,
`q_memory_size > 0` and `stack='attendre_delay'` (models/attendre_delay.py).

  python train.py --config=configs/attendre.py --workdir=workdirs/attendre
  python eval.py --config=configs/attendre.py --workdir=workdirs/attendre \\
      --config.eval.memory_sweep='variant=attendre;policy=fifo,lra_max,lfa;memory_size=128,256,512'
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'model': {
          'attention': 'attendre',
          'mem_len': 0,                  # Attendre keeps no cache of hidden states
          'attendre': {
              'memory_size': 256,        # M: K/V memory entries per layer and row
              'policy': 'lra_max',       # fifo | sink | lru | lfu | lra_{last,max,sum} | lfa
              'order': 'insert_first',   # the paper's: insert the chunk, then retrieve
              'admission': 'score',      # new entries compete on their initial score
          },
      },
      'data': {'chunk_len': 128},
  })

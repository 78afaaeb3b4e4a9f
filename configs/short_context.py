"""No memory: the model of the eval-time memory sweep (Attendre's setting, in miniature).

Vanilla causal attention with RoPE, 512-token chunks and `mem_len = 0`: the
model is trained on a context of at most 512 tokens and never with a memory.
eval.py then splits held-out documents into 128-token chunks and gives the
model, at evaluation time only, a memory of 64-512 entries with an eviction
policy (FIFO, sinks, LRA, LFA; Yang & Hua et al., 2024), capping RoPE
distances at 511 (LM-Infinite, as the Attendre paper does) so that no
query-key distance exceeds what training saw. A FIFO memory of M then shows
the model the last M + 128 tokens; a policy chooses which M tokens to keep.

Same model size and tokens per step (4 rows x 512) as configs/default.py;
900 steps, evaluated every 300 (the defaults of `train`).

  python train.py --config=configs/short_context.py --workdir=workdirs/short_context
  python eval.py --config=configs/short_context.py --workdir=workdirs/short_context \\
      --config.eval.memory_sweep='policy=fifo,sink,lra_max,lra_sum,lfa;memory_size=64,128,256,512;rope_max_distance=511'

(variant attendre, q_memory_size 0 and chunk = eval.chunk_len = 128 are the defaults;
`eval.memory_sweep`: longformer_jax/evaluation/memory_sweep.py, '' = off.)
A first try trained on 64-token chunks (and capped at 63) could not use any
memory: FIFO memories of 128-1024 made it worse (2.310 -> 2.357 bits/byte),
so the context the model was trained on must cover the memory.
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'model': {'attention': 'vanilla',
                'mem_len': 0},            # trained without any memory
      'data': {'chunk_len': 512,
               'batch_size': 4},
      # Evaluation: held-out documents, 128-token chunks, an eval-time memory.
      'eval': {'split': 'test',
               'chunk_len': 128,
               'max_tokens': 131072},
  })

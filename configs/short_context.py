"""Short context, no memory: the model of the eval-time memory sweep (Attendre's setting).

Vanilla causal attention with RoPE, 64-token chunks and `mem_len = 0`: the
model never sees more than 64 tokens. eval.py then gives it, at evaluation
time only, a memory of 64-1024 entries with an eviction policy (FIFO, sinks,
LRA, LFA; Yang & Hua et al., 2024) and a 128-token evaluation chunk, with
the LM-Infinite cap `rope_max_distance=63` so that no query-key distance
exceeds what training saw. Same model size as configs/default.py; 2048
tokens per step like the default (32 rows x 64), so training takes about as
long (roughly 10 minutes on 2 CPU cores; not measured at the full length).

  python train.py --config=configs/short_context.py --workdir=workdirs/short_context
  python eval.py --config=configs/short_context.py --workdir=workdirs/short_context \\
      --config.eval.memory_sweep='policy=fifo,sink,lra_max,lra_sum,lfa;memory_size=64,128,256,512,1024;rope_max_distance=63'

(variant attendre, q_memory_size 0 and chunk = eval.chunk_len = 128 are the defaults.)
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'vanilla'
  config.model.mem_len = 0
  config.data.chunk_len = 64
  config.data.batch_size = 32
  config.train.num_steps = 900
  config.train.eval_every = 300
  # Evaluation: held-out documents, 128-token chunks (twice the training context).
  config.eval.split = 'test'
  config.eval.chunk_len = 128
  config.eval.max_tokens = 262144
  # 'variant=...;policy=...;memory_size=...' (longformer_jax/train/memory_sweep.py); '' = off.
  config.eval.memory_sweep = ''
  return config

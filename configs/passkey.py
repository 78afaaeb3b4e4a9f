"""Passkey retrieval: train short, evaluate long with each eval-time memory (docs/passkey.md).

A byte-level 2-layer model with vanilla RoPE attention and no memory learns,
on 256-token chunks, to repeat a 5-digit key hidden in filler text
(Mohtashami & Jaggi, 2023; `data.corpus='passkey'`, longformer_jax/data/passkey.py:
documents of up to 255 bytes, key at a random depth). Nothing but the LM loss
trains it; the only unpredictable tokens are the key's digits, so once the
filler is learnt the loss is the digits' loss. eval.py then reads documents
of 256 to 4096 bytes in 128-token chunks with a memory chosen at evaluation
time (evaluation/passkey_grid.py): none, a FIFO cache of hidden states (XL),
sinks + window (StreamingLLM), Attendre's K/V memory with FIFO / LRA / LFA
eviction, a kNN memory; each memory of 128 entries plus the 128-token chunk
spans the 256 tokens the model was trained on, and the LM-Infinite cap keeps
RoPE distances within them where the variant has it.

  python train.py --config=configs/passkey.py --workdir=workdirs/passkey
  python eval.py --config=configs/passkey.py --workdir=workdirs/passkey \\
      --config.eval.passkey_grid='lengths=256,512,1024,2048,4096;depths=0,25,50,75,100;documents=8;memories=none,xl,sinks,attendre_fifo,attendre_lra_max,attendre_lfa,knn;memory_size=128;rope_max_distance=255'

writes workdirs/passkey/eval/passkey_grid.json and one heat map per memory,
passkey_grid_<memory>.png (rows: depth 0% at the top; columns: length,
shortest at the left; red = 0, green = 1 accuracy).
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'model': {'attention': 'vanilla',
                'mem_len': 0,             # trained without any memory
                'num_layers': 2,          # copying a key needs an induction head: two layers
                'd_model': 128, 'num_heads': 4, 'head_dim': 32, 'd_ff': 512},
      'data': {'corpus': 'passkey',
               'chunk_len': 256,          # documents of up to 255 bytes + BOS
               'batch_size': 16},
      'train': {'num_steps': 2000, 'eval_every': 500, 'checkpoint_every': 500,
                'eval_max_tokens': 16384},
      'eval': {'split': 'test',
               'chunk_len': 128},
  })

"""Attendre's context-length-extension experiment at PG-19 scale, for a TPU pod slice.

The paper's setting (Yang & Hua et al., 2024): a model trained with a short
context and no memory is given, at evaluation time only, a K/V memory with
an eviction policy. Train a RoPE decoder on 512-token chunks without memory
(the model of configs/pg19_xl.py with vanilla attention), then sweep
memories of 512-2048 entries and their policies over test documents in
chunks of 512, RoPE distances capped at the training context (LM-Infinite).
configs/short_context.py is the same experiment in miniature on a CPU.

The sweep (`eval.memory_sweep`, set below: longformer_jax/evaluation/memory_sweep.py)
runs the layer in the paper's order (`order=insert_first`, Figure 1: the
chunk is inserted into the memory, then the queries retrieve from the memory
alone) with new entries competing on their initial score
(`admission=score`). A query then sees at most M keys, so M starts at the
chunk length (512); `order=attend_first`, the section's default, attends to
[memory; chunk] (M + 512 keys) and inserts afterwards.

Prepare the data and a tokenizer first (see configs/pg19_xl.py), then
  python train.py --config=configs/pg19_attendre.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$DATA --config.data.sentencepiece_model=$DATA/spm32k.model
  python eval.py --workdir=$WORKDIR --config.eval.split=test
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {'attention': 'vanilla',
                'mem_len': 0},              # trained without any memory
      'eval': {'mem_lens': '',              # no cache to sweep
               'chunk_len': 512,
               'max_tokens': 4_000_000,
               'memory_sweep': ('policy=fifo,sink,lra_max,lfa;memory_size=512,1024,2048;'
                                'rope_max_distance=511;lfa_gamma=0.9;'
                                'order=insert_first;admission=score')},
  })

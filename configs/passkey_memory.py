"""Passkey retrieval trained with the memory in the loop (docs/passkey.md).

configs/passkey.py trains without memory and adds one only at evaluation;
here each memory family is trained with its memory, after a length
curriculum: 1,000 steps of documents of one chunk at most (105-127 bytes),
where the model learns to copy the key from its local context, then 2,000
steps of documents of 105 to 2,048 bytes (log-uniform lengths, so about as
many documents per octave; `data.passkey_*`, data/passkey.py,
data/curriculum_streams.py), the needle at a uniform random depth, read in
128-token chunks with the memory carried from chunk to chunk by the
training streams (reset at each document's BOS). Most long documents span
several chunks, so their digits can only be predicted from the memory.

One config file, the memory after the colon:

  python train.py --config=configs/passkey_memory.py:knn --workdir=workdirs/passkey_knn
  python eval.py --config=configs/passkey_memory.py:knn --workdir=workdirs/passkey_knn \\
      --config.eval.passkey_grid='max_length=65536;documents=16;memories=trained'

| choice | the memory trained with | reach (tokens back from the chunk) |
|---|---|---|
| none | no memory: each chunk alone (vanilla RoPE) | 0 |
| xl | Transformer-XL cache of 128 hidden states per layer | 128 |
| compressive | XL cache 128 + 128 compressed slots at rate 4 | 128 + 4 x 128 |
| knn | layer 2 of 2 a Memorizing layer: kNN memory of 2,048 (key, value) pairs, top 32; local cache of 128 in both layers | 2,048 |
| knn_no_cache | the same without the local cache | 2,048 |
| attendre_lra_max / attendre_lfa | Attendre K/V memory of 128 entries, evicting by attention | what the policy keeps |
| attendre_lra_max_score | the same LRA-max memory admitting new entries by score (mean - std) | what the policy keeps |
| attendre_fifo | the same memory evicting first-in first-out (the control) | 128 |
| expire_span | Expire-Span: capacity 1,024, spans up to 4,096 learnt per token | learnt |
| expire_span_recipe | the same with the authors' recipe: spans up to 16,384, ramp 64, pre-division 64, their ramp-only penalty at 1e-6, random shortening, spans starting at 0.1 of the largest; documents up to 4,096 bytes | learnt |
| adaptive_span | Adaptive-Span over an XL memory of 1,024, spans learnt per head from 128 | learnt, <= 1,024 |
| sinks | StreamingLLM: 4 sink tokens + a window of 128 | the 127 tokens before each query + the document's first 4 |

The model is configs/passkey.py's (byte level, 2 layers, d_model 128, 4 heads
of 32), with relative positions where the variant has them (xl, compressive,
expire_span, adaptive_span) and RoPE otherwise.
"""

from configs import passkey
from longformer_jax.config.errors import require
from longformer_jax.config.overrides import merged

CHUNK = 128
MEMORIES = {
    'none': {'attention': 'vanilla', 'mem_len': 0},
    'xl': {'attention': 'xl', 'mem_len': 128},
    'compressive': {'attention': 'compressive', 'mem_len': 128,
                    'compressive': {'compressed_mem_len': 128, 'rate': 4},
                    'aux_loss_weights': {'reconstruction_loss': 1.0}},
    # The kNN memory in the top layer (the paper puts it near the top), beside the local
    # attention's XL-style cache of 128 (the paper's layout too): beyond chunk + cache only
    # the kNN memory can supply the needle. Without the cache (knn_no_cache) a token at a
    # chunk's start has no left context in layer 1, and its kNN key lacks what an
    # induction head matches on (docs/passkey.md measures what that costs).
    'knn': {'attention': 'vanilla', 'mem_len': 128,
            'layer_schedule': {'attention': 'vanilla,memorizing'},
            'memorizing': {'memory_size': 2048, 'top_k': 32, 'normalize_qk': True}},
    'knn_no_cache': {'attention': 'vanilla', 'mem_len': 0,
            'layer_schedule': {'attention': 'vanilla,memorizing'},
            'memorizing': {'memory_size': 2048, 'top_k': 32, 'normalize_qk': True}},
    'attendre_lra_max': {'attention': 'attendre', 'mem_len': 0,
                         'attendre': {'memory_size': 128, 'policy': 'lra_max'}},
    # The paper's admission: a new entry starts at mean - 1 * std of the memory's scores and
    # replaces an old one only if that beats it (docs/attendre_qa.md, "The mechanism").
    'attendre_lra_max_score': {'attention': 'attendre', 'mem_len': 0,
                               'attendre': {'memory_size': 128, 'policy': 'lra_max',
                                            'admission': 'score'}},
    'attendre_lfa': {'attention': 'attendre', 'mem_len': 0,
                     'attendre': {'memory_size': 128, 'policy': 'lfa'}},
    'attendre_fifo': {'attention': 'attendre', 'mem_len': 0,
                      'attendre': {'memory_size': 128, 'policy': 'fifo'}},
    'expire_span': {'attention': 'expire_span', 'mem_len': 1024,
                    'expire_span': {'max_span': 4096},
                    'aux_loss_weights': {'expire_span_loss': 1e-6}},
    # The authors' recipe (facebookresearch/transformer-sequential: enwik8_small.sh's ramp 64,
    # pre-division 64 and loss 1e-6; their code's penalty on the ramp only, initial spans at
    # 0.1 of the largest, and random shortening, `--expire-span-noisy`), with spans up to
    # 16,384; trained on documents up to 4,096 bytes (MEMORY_DATA) so that a needle must
    # outlive up to 4,096 tokens of filler.
    'expire_span_recipe': {'attention': 'expire_span', 'mem_len': 1024,
                           'expire_span': {'max_span': 16384, 'ramp': 64, 'pre_div': 64.0,
                                           'loss': 'ramp', 'shorten': True,
                                           'init_fraction': 0.1},
                           'aux_loss_weights': {'expire_span_loss': 1e-6}},
    # Spans start at z = 128 (init 0.125 of max_span): from z = 0 they never grew (every
    # span 0 after 3,000 steps, 0.00 in every cell), as the reach z + ramp = 32 is shorter
    # than the 62-token shortest copy distance, so no copying gradient reaches a span
    # (docs/passkey.md). From 128 one head of layer 1 settles at 112 tokens.
    'adaptive_span': {'attention': 'adaptive_span', 'mem_len': 1024,
                      'adaptive_span': {'max_span': 1024, 'init': 0.125},
                      'aux_loss_weights': {'span_loss': 1e-5}},
    'sinks': {'attention': 'streaming_sinks', 'mem_len': 0,
              'streaming_sinks': {'num_sinks': 4, 'window': CHUNK}},
}


# Training data of a memory that departs from the common one below.
MEMORY_DATA = {'expire_span_recipe': {'passkey_max_length': 4096}}


def get_config(arg: str = 'knn') -> dict:
  require(arg in MEMORIES, '--config', f'passkey_memory.py:{arg}: unknown memory; use one of '
          f'{", ".join(MEMORIES)}')
  return merged(passkey.get_config(), {
      'model': MEMORIES[arg],
      'data': {'chunk_len': CHUNK,
               'passkey_max_length': 2048,
               'passkey_lengths': 'log_uniform',
               'passkey_curriculum_steps': 1000,
               'batch_size': 16,
               **MEMORY_DATA.get(arg, {})},
      'train': {'num_steps': 3000, 'eval_every': 1000, 'checkpoint_every': 500,
                'eval_max_tokens': 65536},
      'eval': {'split': 'test', 'chunk_len': CHUNK},
  })

"""No memory, subword tokens: the model of the chunk-128 eval-time memory sweep.

The byte-level model of configs/short_context.py uses only about the last
150 bytes, so at evaluation chunks of 128 tokens no memory policy can matter
(docs/results.md, "Eval-time memories and eviction policies"). This model reads SentencePiece tokens
(4,096 pieces trained on the stdlib corpus, 3.0 bytes each on the test
split), so its 512-token training context spans about 1.5 KB of source, where
identifiers recur over hundreds of tokens, and it trains on 20x more text
(3,000 steps of 8 x 512 tokens). Like configs/short_context.py it is trained
without memory on 512-token chunks and given a memory only at evaluation
time (Attendre's setting). Result (docs/results.md): it uses about 380 tokens of
context, still too few for the policies to beat FIFO at chunks of 128.

  python -m longformer_jax.data.sentencepiece_tokenizer --corpus=stdlib \\
      --vocab_size=4096 --max_sentences=300000 --out=spm/stdlib4k
  python train.py --config=configs/short_context_spm.py --workdir=runs/short_context_spm
  python eval.py --config=configs/short_context_spm.py --workdir=runs/short_context_spm \\
      --config.eval.memory_sweep='policy=fifo,sink,lra_max,lra_sum,lfa;memory_size=128,256,512;rope_max_distance=511'

(`--config.data.sentencepiece_model=PATH` if the model file is elsewhere.)
"""

from configs import short_context
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(short_context.get_config(), {
      'data': {'tokenizer': 'sentencepiece',
               'sentencepiece_model': 'spm/stdlib4k.model',
               # A few test-suite files are Latin-1 on purpose; SentencePiece encodes UTF-8 only.
               'skip_undecodable': True,
               'batch_size': 8},
      'train': {'num_steps': 3000,
                'eval_every': 1000,
                'checkpoint_every': 500},
  })

"""Model FLOPs of the decoder LM, for model-FLOPs utilisation (MFU).

Counts the multiply-adds (2 FLOPs each) of every matmul the model executes
for one chunk, divided by the chunk's tokens: projections, the per-chunk
recomputation of keys/values of the memory, Transformer-XL's relative-key
projection, scores and weighted values over all `mem_len + chunk` keys
(masked ones included: they are computed), the feed-forward network and
the output logits. Training counts 3x the forward pass (the backward pass
is about twice the forward), as in the PaLM paper's MFU (appendix B).
Elementwise work (softmax, norms, GELU) is not counted.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


def forward_flops_per_token(config: 'ResolvedModel', chunk_len: int,
                            batch_size: int) -> float:
  """Forward FLOPs per token of `DecoderLM(config)` on `[batch_size, chunk_len]` chunks
  (`config`: the resolved model, models/resolved_model.py, with `vocab_size`)."""
  d, inner = config.d_model, config.num_heads * config.head_dim
  keys = config.mem_len + chunk_len
  keys_per_query = keys / chunk_len
  per_layer = (
      2 * d * inner                        # query
      + 2 * 2 * d * inner * keys_per_query  # key, value over [memory; chunk]
      + 2 * inner * d                      # output projection
      + 2 * 2 * d * config.d_ff            # feed-forward in and out
      + 2 * 2 * keys * inner)              # scores q.k and weights.v
  if config.attention == 'xl':
    per_layer += (2 * keys * inner          # position scores (q + v).W_kR R
                  + 2 * d * inner * keys_per_query / batch_size)  # W_kR R: once per chunk
  return config.num_layers * per_layer + 2 * d * config.vocab_size


def train_flops_per_token(config: 'ResolvedModel', chunk_len: int,
                          batch_size: int) -> float:
  return 3.0 * forward_flops_per_token(config, chunk_len, batch_size)

"""Key/value-cache decoding: one token per step, O(cache) work per token.

A model whose layers are all the vanilla attention keeps, for generation, a
cache of the last M tokens' keys and values per layer: it is run as the
eval-time Attendre memory with FIFO eviction (`attention/attendre.py`,
`order='attend_first'`, no Q memory), which reads vanilla's parameters
(`query`, `key`, `value`, `out`) and stores each token's projected key and
value, rotated at scoring time by the RoPE of the distance (so cached keys
need no re-projection). The `ChunkWindowDecoder` then runs that model with
chunks of one token: each new token is projected once, attends to the M
cached keys and itself, and enters the cache (the oldest leaves).

So token t sees the last M tokens and itself: a sliding window of M + 1.
While the whole text (prompt and output) fits in it, the logits are those of
the full causal model over the text (tests/generation/test_kv_cache.py checks them
against a full recompute and, for an imported Llama, against transformers'
logits); beyond it the oldest tokens are dropped, as in any fixed-size cache.
The chunk-window decoder of the run's own chunking stays the exact reference
for runs trained with memories.

Refused (one line, `UserError`): a model with other attention variants, with
learned absolute positions (they are read at offsets within a chunk) or T5's
relative buckets (the cache rotates; it has no bias table).
"""

import ml_collections

from longformer_jax.config.errors import UserError
from longformer_jax.evaluation import memory_sweep
from longformer_jax.models.resolved_model import ResolvedModel, lm_model_config


def kv_cache_refusal(model: ml_collections.ConfigDict) -> str:
  """Why a run's `config.model` cannot decode with a key/value cache ('' if it can)."""
  schedule = dict(model.layer_schedule)
  if model.attention != 'vanilla' or 'attention' in schedule:
    return (f"model.attention={model.attention!r}: the key/value cache serves models whose "
            "layers are all 'vanilla' (the chunk-window decoder serves the others)")
  if model.position_embedding != 'rotary':
    return (f"model.position_embedding={model.position_embedding!r}: the key/value cache "
            "needs rotary positions")
  return ''


def kv_cache_model_config(model: ml_collections.ConfigDict, vocab_size: int,
                          cache_size: int) -> ResolvedModel:
  """The generation model: `model` (a run's `config.model`) with a FIFO key/value cache of
  `cache_size` tokens per layer, for chunks of one token."""
  if cache_size < 1:
    raise UserError(f'--kv_cache: {cache_size} must be >= 1 (cached tokens per layer)')
  refusal = kv_cache_refusal(model)
  if refusal:
    raise UserError(f'--kv_cache: {refusal}')
  point = memory_sweep.SweepPoint(variant='attendre', policy='fifo', memory_size=cache_size,
                                  q_memory_size=0, chunk=1)
  return lm_model_config(model, vocab_size, **memory_sweep.model_overrides(point, model))

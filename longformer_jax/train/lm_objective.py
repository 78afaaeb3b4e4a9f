"""Next-token loss of a decoder LM over the chunks of a step.

The batch is a dict of `[batch, n_chunks * chunk_len]` arrays: `inputs`,
`targets`, `positions`, `segment_ids`, `doc_start`, `input_mask`,
`target_mask` (see `longformer_jax.train.batches`). The chunk driver scans
the model over the chunks; losses are summed inside the scan so that the
logits of only one chunk are alive at a time.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from longformer_jax.attention.context import AttentionContext
from longformer_jax.models.chunk_driver import scan_chunks


def chunk_context(chunk: dict, deterministic: bool) -> AttentionContext:
  """The attention context of one `[batch, chunk_len]` chunk."""
  return AttentionContext(
      positions=chunk['positions'],
      segment_ids=chunk['segment_ids'],
      reset=chunk['doc_start'][:, 0],
      valid=chunk['input_mask'],
      deterministic=deterministic)


def lm_sums(model: nn.Module, params, memory, batch: dict, chunk_len: int, *,
            rng: Optional[jax.Array] = None, deterministic: bool = True,
            token_bytes: Optional[jax.Array] = None):
  """Scans the model over the step's chunks and sums the next-token loss.

  Args:
    model: a `DecoderLM`.
    params: its parameters.
    memory: the memory pytree at the start of the step.
    batch: `[batch, n * chunk_len]` arrays (module docstring).
    chunk_len: tokens per chunk.
    rng: dropout key (folded with the chunk index), needed when not
      deterministic.
    token_bytes: optional `[vocab]` int32 UTF-8 bytes per token; adds
      `bytes`, the number of bytes the valid targets stand for.
  Returns:
    `(memory, sums)` with float32 scalars `loss_sum` (nats) and `tokens` (and
    `bytes` when `token_bytes` is given).
  """

  def one_chunk(states, chunk, index):
    rngs = {} if deterministic else {'dropout': jax.random.fold_in(rng, index)}
    logits, states, _ = model.apply({'params': params}, chunk['inputs'], states,
                                      chunk_context(chunk, deterministic), rngs=rngs)
    mask = chunk['target_mask'].astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, chunk['targets'])
    sums = {'loss_sum': jnp.sum(nll * mask), 'tokens': jnp.sum(mask)}
    if token_bytes is not None:
      sums['bytes'] = jnp.sum(token_bytes[chunk['targets']] * mask)
    return states, sums

  memory, per_chunk = scan_chunks(one_chunk, memory, batch, chunk_len)
  return memory, jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), per_chunk)

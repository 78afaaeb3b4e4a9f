"""Encoder-output memory for encoder-decoder models (Attendre, Yang & Hua et al., 2024).

When an encoder reads a long input chunk by chunk, its outputs are kept in a
FIFO data-only memory (memory/data_only.py), and the decoder's
cross-attention reads the whole memory: every valid entry of the query's
document, with no causal rule (the encoder has read all of them) and no
position encoding (cross-attention compares contents only, as in LED/T5).
The memory keeps the `capacity` most recent encoder outputs of each row,
with their positions and document ids, and `insert` returns what it evicted.

Shapes: memory data `[batch, capacity, d_model]` (logical axes batch,
memory, embed); decoder queries `[batch, q, d_model]`.

Usage:
  memory = encoder_output.create(batch, capacity, d_model)
  for each encoder chunk:
    memory = encoder_output.clear_rows(memory, ctx.reset)
    memory, evicted = encoder_output.insert(memory, enc_out, ctx.positions, ctx.segment_ids, ctx.valid)
  y = EncoderMemoryCrossAttention(heads, head_dim, d_model)(decoder_x, memory, decoder_segment_ids)
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.core.dot_product import attend
from longformer_jax.memory import data_only
from longformer_jax.memory.entries import MemoryEntries, entries_from_chunk
from longformer_jax.memory.policies import policy_from_name

FIFO = policy_from_name('fifo')


def create(batch_size: int, capacity: int, d_model: int, dtype=jnp.float32) -> MemoryEntries:
  """An empty memory of `capacity` encoder outputs per row."""
  return data_only.create(batch_size, capacity, (d_model,), dtype, feature_axes=('embed',))


def insert(memory: MemoryEntries, encoder_outputs: jax.Array, positions: jax.Array,
           segment_ids: jax.Array, valid: jax.Array,
           stop_gradient: bool = True) -> tuple[MemoryEntries, MemoryEntries]:
  """Appends `encoder_outputs [b, n, d_model]`; the oldest entries fall out.

  `stop_gradient=True` (memory carried across chunks, docs/design.md, contract 4)
  blocks gradients into the stored outputs; a model whose decoder should
  train the encoder through the current chunk's outputs inserts them with
  `stop_gradient=False` (and stops the gradient of the carried memory
  itself, e.g. `jax.lax.stop_gradient(memory)` before the insert).

  Returns `(memory, evicted)`: exactly n evicted entries, invalid ones where
  there was room.
  """
  if stop_gradient:
    encoder_outputs = jax.lax.stop_gradient(encoder_outputs)
  new = entries_from_chunk(encoder_outputs.astype(memory.data.dtype),
                           positions, segment_ids, valid, data_axes=memory.data_axes)
  return data_only.insert(memory, new, FIFO)


def get_all(memory: MemoryEntries) -> MemoryEntries:
  """Every entry (invalid ones flagged by `valid`); slots are not in position order."""
  return data_only.get_all(memory)


def clear_rows(memory: MemoryEntries, reset: jax.Array) -> MemoryEntries:
  """Forgets the rows where `reset [batch]` is set (a new document starts)."""
  return data_only.clear_rows(memory, reset)


def cross_attention_mask(memory: MemoryEntries,
                         query_segment_ids: Optional[jax.Array] = None,
                         num_queries: Optional[int] = None) -> jax.Array:
  """`[batch, q, capacity]` bool: valid entries (of the query's document when given)."""
  if query_segment_ids is None:
    return jnp.broadcast_to(memory.valid[:, None, :],
                            (memory.rows, num_queries, memory.capacity))
  return memory.valid[:, None, :] & (query_segment_ids[:, :, None] == memory.segment_ids[:, None, :])


class EncoderMemoryCrossAttention(nn.Module):
  """Decoder queries attend to every (same-document) encoder output in the memory.

  `__call__(x [b, q, d_model], memory, query_segment_ids [b, q] or None) -> [b, q, d_model]`.
  Parameters `query`, `key`, `value`, `out` (the projections of every
  attention variant). A query with no valid entry gets 0 (then `out`).
  """
  num_heads: int
  head_dim: int
  d_model: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, memory: MemoryEntries,
               query_segment_ids: Optional[jax.Array] = None) -> jax.Array:
    entries = get_all(memory)
    q = projections.project_heads(x, self.num_heads, self.head_dim, 'query', self.dtype)
    k = projections.project_heads(entries.data, self.num_heads, self.head_dim, 'key', self.dtype)
    v = projections.project_heads(entries.data, self.num_heads, self.head_dim, 'value', self.dtype)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / jnp.sqrt(self.head_dim).astype(self.dtype)
    out = attend(logits, cross_attention_mask(entries, query_segment_ids, x.shape[1]), v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, self.d_model, self.dtype)

"""The q/k/v and output projections of the variants, and their [memory of past hidden states; chunk]."""

import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.layers.linear import projection
from longformer_jax.layers.positional import apply_rotary
from longformer_jax.memory import fifo


def chunk_entries(x: jax.Array, ctx: AttentionContext) -> fifo.FifoMemory:
  """The chunk's tokens as memory entries: `x [batch, chunk, d_model]`."""
  return fifo.FifoMemory(values=x, positions=ctx.positions,
                         segment_ids=ctx.segment_ids, valid=ctx.valid)


def memory_and_chunk(state: fifo.FifoMemory, x: jax.Array,
                     ctx: AttentionContext) -> tuple[fifo.FifoMemory, fifo.FifoMemory]:
  """Keys' source for this chunk, and the memory to carry to the next chunk.

  Rows flagged by `ctx.reset` forget their memory first. The memory is
  stop-gradient (Dai et al., 2019, eq. in section 3.2: SG(h_{tau-1})).

  Returns:
    `(context, new_state)`: `context` is `[memory; chunk]`, `[batch, mem + chunk]`
    entries, oldest first; `new_state` is the memory after inserting the chunk.
  """
  memory = fifo.clear_rows(state, ctx.reset)
  chunk = chunk_entries(x, ctx)
  context = fifo.concat(jax.lax.stop_gradient(memory), chunk)
  new_state, _ = fifo.insert(memory, jax.lax.stop_gradient(chunk))
  return context, new_state


def project_heads(x: jax.Array, num_heads: int, head_dim: int, name: str, dtype,
                  use_bias: bool = False) -> jax.Array:
  """`[batch, length, d_model] -> [batch, length, heads, head_dim]` (bias `[heads, head_dim]`)."""
  return projection((num_heads, head_dim), kernel_axes=('embed', 'heads', 'head_dim'),
                    name=name, dtype=dtype, use_bias=use_bias,
                    bias_axes=('heads', 'head_dim'))(x)


def project_output(x: jax.Array, d_model: int, dtype, use_bias: bool = False) -> jax.Array:
  """`[batch, length, heads, head_dim] -> [batch, length, d_model]` (bias `[d_model]`)."""
  return projection(d_model, num_in=2, kernel_axes=('heads', 'head_dim', 'embed'),
                    name='out', dtype=dtype, use_bias=use_bias, bias_axes=('embed',))(x)


def chunk_qkv(x: jax.Array, num_heads: int, head_dim: int, dtype):
  """Vanilla's projections of a chunk, unrotated (variants with their own positions: relative
  labels in ETC and BP-Transformer). Returns `(q, k, v)`, each `[batch, chunk, heads, head_dim]`,
  with q already scaled by 1/sqrt(head_dim).
  """
  q = project_heads(x, num_heads, head_dim, 'query', dtype) / jnp.sqrt(head_dim).astype(dtype)
  return (q, project_heads(x, num_heads, head_dim, 'key', dtype),
          project_heads(x, num_heads, head_dim, 'value', dtype))


def chunk_rotary_qkv(x: jax.Array, ctx: AttentionContext, num_heads: int, head_dim: int, dtype):
  """Vanilla's projections of a chunk, RoPE-rotated relative to its first position.

  For stateless variants that attend within the chunk. Returns `(q, k, v)`,
  each `[batch, chunk, heads, head_dim]`, with q already scaled by
  1/sqrt(head_dim).
  """
  q, k, v = chunk_qkv(x, num_heads, head_dim, dtype)
  relative = ctx.positions - ctx.positions[:, :1]
  return apply_rotary(q, relative), apply_rotary(k, relative), v

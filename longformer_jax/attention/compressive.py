"""Compressive Transformer attention (Rae et al., 2019).

Transformer-XL attention (same projections, biases and relative positions,
parameter names included) over `[compressed memory; memory; chunk]`:
- memory: the last `mem_len` (n_m) hidden states of this layer's input, FIFO;
- compressed memory: `compressed_mem_len` (n_cm) entries, FIFO; each chunk, the
  n_s entries evicted from the memory are compressed by rate c
  (`rate`) into floor(n_s / c) entries (see `longformer_jax/memory/compression.py`)
  that are pushed into it.

Settings: `config.model.compressive` (`CompressiveConfig`); the memory
length n_m is the shared `model.mem_len`.

A compressed entry sits at the position of the newest valid entry of its
group (of its own position for `most_used`); relative positions are gathered
from these stored positions, so the score of a query with a compressed entry
uses the distance to the group's newest member.

Attention-reconstruction loss (Rae et al., section 3.2, algorithm 2): the
chunk's queries attend, by content only and with this layer's query/key/value
weights, once over the evicted entries and once over their compressed form;
the loss is the mean squared difference of the two outputs. The layer input,
the evicted entries and the attention weights are stop-gradient in it, so it
trains only the compression network; and the compressed memory is stored
stop-gradient, so the language-model loss never reaches the compression
network. Aux: `reconstruction_loss` (weight `model.aux_loss_weights.reconstruction_loss`)
and the statistic `compressed_memory_occupancy` (fraction of valid compressed slots).

Usage statistics for `most_used`: every memory entry accumulates, per chunk,
the attention it received averaged over heads and the chunk's valid queries;
its "average attention" is that sum divided by the number of chunks.
"""

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.xl import XLAttention
from longformer_jax.config.section import Section
from longformer_jax.memory import compression, fifo


@dataclasses.dataclass(frozen=True)
class CompressiveConfig(Section):
  """`config.model.compressive`; the memory length n_m is the shared `model.mem_len`."""
  compressed_mem_len: int = 0  # n_cm, entries of the compressed memory (0: none)
  function: str = 'conv'       # max_pool | mean_pool | conv | dilated_conv | most_used
  rate: int = 3                # c: n_s evicted entries become floor(n_s / c)
  kernel: int = 0              # dilated_conv window length (0: the rate c)
  dilation: int = 2            # dilated_conv spacing of the window
  clamp_len: int = -1          # clamp relative distances to this (-1: off)

  def kernel_length(self) -> int:
    """The dilated_conv window length: `kernel`, or the rate c when it is 0."""
    return self.kernel or self.rate

  def validate(self, env) -> None:
    self.require(self.compressed_mem_len >= 0, 'compressed_mem_len', 'must be >= 0')
    self.require(self.function in compression.COMPRESSION_FUNCTIONS, 'function',
                 f'must be one of {compression.COMPRESSION_FUNCTIONS}')
    self.require(self.rate >= 1, 'rate', 'must be >= 1')
    self.require(self.kernel >= 0, 'kernel', 'must be >= 0 (0: the rate)')
    self.require(self.dilation >= 1, 'dilation', 'must be >= 1')
    dilated = self.function == 'dilated_conv'
    self.require(dilated or self.kernel == 0, 'kernel', "is read only by function='dilated_conv'")
    self.require(dilated or self.dilation == 2, 'dilation',
                 "is read only by function='dilated_conv'")
    self.require(self.clamp_len == -1 or self.clamp_len > 0, 'clamp_len',
                 'must be -1 (off) or > 0')
    # Each chunk evicts as many entries as it has tokens (n_s = chunk length).
    for chunk_len in (env.chunk_lens if env is not None else ()):
      self.require(self.compressed_mem_len == 0 or self.rate <= chunk_len, 'rate',
                   f'must be <= every chunk length ({chunk_len}): the n_s = {chunk_len} '
                   'entries a chunk evicts must compress into at least one')


@flax.struct.dataclass
class CompressiveMemory:
  memory: fifo.FifoMemory      # [batch, n_m] hidden states, oldest first
  compressed: fifo.FifoMemory  # [batch, n_cm] compressed hidden states, oldest first
  usage: jax.Array             # [batch, n_m] float32: attention received, summed over chunks
  usage_count: jax.Array       # [batch, n_m] float32: chunks the entry has been attended in

  def logical_axes(self) -> 'CompressiveMemory':
    return CompressiveMemory(memory=self.memory.logical_axes(),
                             compressed=self.compressed.logical_axes(),
                             usage=('batch', 'memory'), usage_count=('batch', 'memory'))


def received_attention(weights: jax.Array, query_valid: jax.Array) -> jax.Array:
  """`weights [b, h, q, k]` -> `[b, k]`: mean over heads and valid queries."""
  per_query = jnp.mean(weights, axis=1)                                     # [b, q, k]
  valid = query_valid.astype(jnp.float32)
  total = jnp.einsum('bqk,bq->bk', per_query, valid)
  return total / jnp.maximum(jnp.sum(valid, axis=1, keepdims=True), 1.0)


def content_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
  """Plain scaled dot-product attention `[b, q, h, d]` over `[b, k, h, d]`; float32 out."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, keys) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  weights = masked_softmax(logits, mask)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, values.astype(jnp.float32))


class CompressiveAttention(XLAttention):
  """`__call__(x [b, c, d_model], state: CompressiveMemory, ctx) -> (y, state, aux)`.

  Attributes:
    shared: the layer's shape (attention/shared_settings.py).
    config: `CompressiveConfig` (the compression and XL's `clamp_len`).
  """
  config: CompressiveConfig = CompressiveConfig()

  Config = CompressiveConfig
  reads_mem_len = True

  def relative_settings(self) -> tuple[int, str]:
    """`(clamp_len, 'gather')`: compressed entries sit at their group's stored positions, so
    relative positions are always gathered."""
    return self.config.clamp_len, 'gather'

  @staticmethod
  def init_state(config: CompressiveConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Empty memory (`[batch_size, mem_len, d_model]`) and compressed memory
    (`[batch_size, compressed_mem_len, d_model]`)."""
    n_cm = config.compressed_mem_len
    zeros = jnp.zeros((batch_size, shared.mem_len), jnp.float32)
    return CompressiveMemory(
        memory=fifo.create(batch_size, shared.mem_len, (shared.d_model,), dtype),
        compressed=fifo.create(batch_size, n_cm, (shared.d_model,), dtype),
        usage=zeros, usage_count=zeros)

  def _max_distance(self, chunk_len: int, mem_len: int, compressed_len: int) -> int:
    """The largest query-key distance a valid entry can have (relative-position table size)."""
    per_block = max(compression.num_compressed(chunk_len, self.config.rate), 1)
    blocks = -(-compressed_len // per_block)
    return chunk_len - 1 + mem_len + blocks * chunk_len

  def _frozen_kernel(self, name: str) -> jax.Array:
    """This layer's projection kernel `name`, stop-gradient."""
    kernel = nn.meta.unbox(self.variables['params'][name]['kernel'])
    return jax.lax.stop_gradient(kernel).astype(self.dtype)

  def reconstruction_loss(self, x: jax.Array, ctx: AttentionContext, old: fifo.FifoMemory,
                          compressed: fifo.FifoMemory) -> jax.Array:
    """Mean squared difference of content attention over `old` and over `compressed`.

    Everything but `compressed.values` (the compression network's output) is
    stop-gradient (Rae et al., 2019, algorithm 2).
    """
    wq, wk, wv = (self._frozen_kernel(name) for name in ('query', 'key', 'value'))
    project = lambda h, w: jnp.einsum('bld,dhe->blhe', h.astype(self.dtype), w)
    q = project(jax.lax.stop_gradient(x), wq)
    old_values = jax.lax.stop_gradient(old.values)
    target = content_attention(
        q, project(old_values, wk), project(old_values, wv),
        causal_document_mask(ctx.positions, ctx.segment_ids, old.positions, old.segment_ids,
                             old.valid))
    estimate = content_attention(
        q, project(compressed.values, wk), project(compressed.values, wv),
        causal_document_mask(ctx.positions, ctx.segment_ids, compressed.positions,
                             compressed.segment_ids, compressed.valid))
    squared = jnp.mean(jnp.square(estimate - jax.lax.stop_gradient(target)), axis=(2, 3))
    valid = ctx.valid.astype(jnp.float32)
    return jnp.sum(squared * valid) / jnp.maximum(jnp.sum(valid), 1.0)

  @nn.compact
  def __call__(self, x: jax.Array, state: CompressiveMemory, ctx: AttentionContext):
    memory = fifo.clear_rows(state.memory, ctx.reset)
    compressed = fifo.clear_rows(state.compressed, ctx.reset)
    chunk = projections.chunk_entries(x, ctx)
    context = fifo.concat(jax.lax.stop_gradient(fifo.concat(compressed, memory)), chunk)
    max_distance = self._max_distance(x.shape[1], memory.capacity, compressed.capacity)
    logits, mask, v = self.attention_logits(x, context, ctx, max_distance)
    weights = masked_softmax(logits, mask)
    out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    y = projections.project_output(out, self.shared.d_model, self.dtype)

    # Memory: insert the chunk; the evicted entries carry their average usage.
    received = jax.lax.stop_gradient(
        received_attention(weights, ctx.valid)[:, compressed.capacity:])     # [b, n_m + c]
    usage = jnp.concatenate([state.usage, jnp.zeros(ctx.valid.shape, jnp.float32)], axis=1)
    count = jnp.concatenate([state.usage_count, jnp.zeros(ctx.valid.shape, jnp.float32)], axis=1)
    usage, count = usage + received, count + 1.0
    new_memory, evicted = fifo.insert(memory, jax.lax.stop_gradient(chunk))
    n_s = evicted.capacity
    average_usage = usage[:, :n_s] / count[:, :n_s]

    compressor = compression.Compressor(
        self.config.function, self.config.rate, self.shared.d_model, self.config.kernel_length(),
        self.config.dilation, self.dtype, name='compression')
    new_entries = compressor(evicted, average_usage)
    loss = self.reconstruction_loss(x, ctx, evicted, new_entries)
    new_compressed, _ = fifo.insert(compressed, jax.lax.stop_gradient(new_entries))
    new_state = CompressiveMemory(memory=new_memory, compressed=new_compressed,
                                  usage=usage[:, n_s:], usage_count=count[:, n_s:])
    occupancy = jnp.mean(new_compressed.valid.astype(jnp.float32)) if new_compressed.capacity \
        else jnp.zeros((), jnp.float32)
    aux = {'reconstruction_loss': loss, 'compressed_memory_occupancy': occupancy}
    return y, new_state, aux

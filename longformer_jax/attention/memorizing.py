"""Memorizing Transformer attention (Wu et al., 2022): local attention + kNN memory.

Each query attends to
- its local context: the chunk (causal) and, with `mem_len > 0`, a FIFO cache
  of the previous `mem_len` hidden states, with rotary positions exactly as
  in attention/vanilla/attention.py (optionally with the LM-Infinite distance cap
  `rope_max_distance`, layers/capped_rotary.py);
- its top-`top_k` (key, value) pairs, per head, retrieved by dot product
  from a key-value memory of the `memory_size` most recent tokens of past
  chunks (FIFO, memory/key_value.py). The memory is stop-gradient and holds
  the keys before rotation: as in the paper, retrieved memories carry no
  position encoding (their positions are kept, for masking only).

Settings: `config.model.memorizing` (`MemorizingConfig`); the local cache
length is the shared `model.mem_len`.

The two results are combined per head by `gate`:
- 'learned' (the paper, section 3.2): g = sigmoid(b_g), one scalar b_g per
  head (parameter `knn_gate`, initialised at 0), out = g * mem + (1 - g) * local;
- 'fixed': g = `gate_value` (no parameter); 'memory_only' is g = 1;
- 'joint': no gate, one softmax over the local and the retrieved keys
  together (no parameter).
A query with no valid retrieved entry (an empty memory, a new document) uses
its local result only (g = 0 for it), so the gate never scales the local
output down for want of memories.

Normalisation (`normalize_qk`, the paper's remedy for stale keys):
queries and keys are L2-normalised over head_dim in both the local and the
memory attention, and the logits are multiplied by a learned per-head scale
(`qk_scale`, initialised at `qk_scale_init`) instead of 1/sqrt(head_dim).
Off by default.

The memory is cleared at document starts (`ctx.reset`), and entries of
documents before the chunk's first document are dropped before retrieval,
so a document that starts inside a chunk never reads its predecessor's
memory (retrieved entries of another document are masked as well).

Evaluation-time use of a model trained with `attention='vanilla'`: the
query/key/value/out parameters have vanilla's names and shapes, and
`gate` in ('joint', 'fixed', 'memory_only') with `normalize_qk=False`
adds no parameter, so the vanilla checkpoint loads as is.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.section import Section
from longformer_jax.memory import fifo, key_value
from longformer_jax.memory.policies import policy_from_name

KNN_GATES = ('learned', 'fixed', 'memory_only', 'joint')
KNN_METHODS = ('exact', 'approx')
FIFO = policy_from_name('fifo')


@dataclasses.dataclass(frozen=True)
class MemorizingConfig(Section):
  """`config.model.memorizing`; the local cache length is the shared `model.mem_len`."""
  memory_size: int = 1024       # (key, value) entries of the kNN memory per row
  top_k: int = 32               # entries retrieved per query and head
  method: str = 'exact'         # exact (lax.top_k) | approx (lax.approx_max_k)
  recall_target: float = 0.95   # method='approx': its recall target
  gate: str = 'learned'         # learned | fixed | memory_only | joint
  gate_value: float = 0.5       # gate='fixed': the memory's weight g
  normalize_qk: bool = False    # L2-normalised q, k with a learned per-head scale (the paper)
  qk_scale_init: float = 16.0   # normalize_qk: the scale's initial value
  rope_max_distance: int = -1   # LM-Infinite cap of local RoPE distances (-1: off)

  def validate(self, env) -> None:
    self.require(self.memory_size > 0, 'memory_size', 'must be > 0')
    self.require(self.top_k > 0, 'top_k', 'must be > 0')
    self.require(self.method in KNN_METHODS, 'method', f'must be one of {KNN_METHODS}')
    self.require(0.0 < self.recall_target <= 1.0, 'recall_target', 'must be in (0, 1]')
    self.require(self.method == 'approx' or self.recall_target == 0.95, 'recall_target',
                 "is read only by method='approx'")
    self.require(self.gate in KNN_GATES, 'gate', f'must be one of {KNN_GATES}')
    self.require(0.0 <= self.gate_value <= 1.0, 'gate_value', 'must be in [0, 1]')
    self.require(self.gate == 'fixed' or self.gate_value == 0.5, 'gate_value',
                 "is read only by gate='fixed'")
    self.require(self.qk_scale_init > 0, 'qk_scale_init', 'must be > 0')
    self.require(self.normalize_qk or self.qk_scale_init == 16.0, 'qk_scale_init',
                 'is read only with normalize_qk=True')
    self.require(self.rope_max_distance >= -1, 'rope_max_distance', 'must be -1 (off) or >= 0')
    if env is not None:
      self.require(self.rope_max_distance == -1 or env.model.position_embedding == 'rotary',
                   'rope_max_distance', "caps RoPE distances; with model.position_embedding="
                   "'learned' there is no rotation to cap (keep -1)")


def l2_normalize(x: jax.Array) -> jax.Array:
  """`[..., head_dim]` scaled to unit L2 norm (in float32, back to x's dtype)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


class MemorizingAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, aux)`.

  `state = {'local': FifoMemory of hidden states [b, mem_len, d_model],
  'knn': key-value MemoryEntries [b, memorizing.memory_size, heads, head_dim]}`.

  Attributes:
    shared: the layer's shape and how it projects its heads (`shared.heads`, imported
      checkpoints: attention/core/checkpoint_heads.py).
    config: `MemorizingConfig`.
  """
  Config = MemorizingConfig
  reads_mem_len = True

  shared: SharedSettings
  config: MemorizingConfig = MemorizingConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: MemorizingConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32) -> dict:
    """An empty local cache (`[batch_size, mem_len, d_model]` hidden states) and an empty
    kNN memory (`[batch_size, memory_size, num_heads, head_dim]` keys and values)."""
    return {
        'local': fifo.create(batch_size, shared.mem_len, (shared.d_model,), dtype),
        'knn': key_value.create(batch_size, config.memory_size, shared.num_heads,
                                shared.head_dim, dtype),
    }

  def _logit_scale(self):
    """`[heads]` multiplier of q.k: learned with normalised q, k; else 1/sqrt(head_dim)."""
    heads = self.shared.num_heads
    if self.config.normalize_qk:
      init = nn.with_logical_partitioning(nn.initializers.constant(self.config.qk_scale_init),
                                          ('heads',))
      return self.param('qk_scale', init, (heads,), jnp.float32)
    return jnp.full((heads,), 1.0 / jnp.sqrt(self.shared.head_dim), jnp.float32)

  def _memory_gate(self):
    """`[heads]` weight g of the memory result (None for 'joint')."""
    heads, gate = self.shared.num_heads, self.config.gate
    if gate == 'learned':
      init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ('heads',))
      return jax.nn.sigmoid(self.param('knn_gate', init, (heads,), jnp.float32))
    if gate == 'fixed':
      return jnp.full((heads,), self.config.gate_value, jnp.float32)
    if gate == 'memory_only':
      return jnp.ones((heads,), jnp.float32)
    return None

  def _retrieve(self, memory, q: jax.Array, ctx: AttentionContext):
    """Top-k per head for `q [b, c, h, d]` -> (keys/values `[b, c, h, k, d]`, mask `[b, h, c, k]`)."""
    found = key_value.retrieve(memory, jax.lax.stop_gradient(q), self.config.top_k,
                               method=self.config.method,
                               recall_target=self.config.recall_target)
    mask = found.valid & (found.segment_ids == ctx.segment_ids[:, :, None, None])
    mask &= found.positions <= ctx.positions[:, :, None, None]
    # What each query retrieved (-1: nothing), for probes (evaluation/knn_probe.py); kept
    # only when the caller makes 'intermediates' mutable.
    self.sow('intermediates', 'knn_retrieved', jnp.where(mask, found.positions, -1))
    return found.keys, found.values, jnp.moveaxis(mask, 2, 1)

  @nn.compact
  def __call__(self, x: jax.Array, state: dict, ctx: AttentionContext):
    context, new_local = projections.memory_and_chunk(state['local'], x, ctx)
    heads = self.shared.heads
    q = heads.query(x, self.shared.num_heads, self.shared.head_dim, self.dtype)
    k, v = heads.keys_values(context.values, self.shared.num_heads, self.shared.head_dim,
                             self.dtype)
    if self.config.normalize_qk:
      q, k = l2_normalize(q), l2_normalize(k)
    scale = self._logit_scale()[None, :, None, None].astype(self.dtype)

    local_logits = heads.scores(q, k, ctx.positions, context.positions,
                                self.config.rope_max_distance,
                                extent=heads.extent(ctx.positions, ctx.valid)) * scale
    local_mask = causal_document_mask(ctx.positions, ctx.segment_ids, context.positions,
                                      context.segment_ids, context.valid)[:, None]
    memory = key_value.clear_rows(state['knn'], ctx.reset)
    # Entries of documents before the chunk's first one serve no query here.
    memory = memory.replace(valid=memory.valid & (memory.segment_ids == ctx.segment_ids[:, :1]))
    mem_keys, mem_values, mem_mask = self._retrieve(memory, q, ctx)
    mem_logits = jnp.einsum('bqhd,bqhkd->bhqk', q, mem_keys.astype(self.dtype)) * scale
    mem_values = mem_values.astype(self.dtype)

    gate = self._memory_gate()
    if gate is None:
      # One softmax over [local keys; retrieved keys].
      weights = masked_softmax(jnp.concatenate([local_logits, mem_logits], axis=-1),
                               jnp.concatenate([jnp.broadcast_to(local_mask, local_logits.shape),
                                                mem_mask], axis=-1)).astype(self.dtype)
      local_w, mem_w = jnp.split(weights, [local_logits.shape[-1]], axis=-1)
      out = (jnp.einsum('bhqk,bkhd->bqhd', local_w, v)
             + jnp.einsum('bhqk,bqhkd->bqhd', mem_w, mem_values))
    else:
      local_out = jnp.einsum('bhqk,bkhd->bqhd',
                             masked_softmax(local_logits, local_mask).astype(self.dtype), v)
      mem_out = jnp.einsum('bhqk,bqhkd->bqhd',
                           masked_softmax(mem_logits, mem_mask).astype(self.dtype), mem_values)
      # Wu et al. (2022), section 3.2: V_a = V_m * g + V_c * (1 - g), g = sigmoid(b_g);
      # queries with nothing retrieved keep the local result.
      g = gate[None, None, :, None] * jnp.moveaxis(mem_mask.any(-1), 1, 2)[..., None]
      out = g.astype(self.dtype) * mem_out + (1 - g).astype(self.dtype) * local_out
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))

    chunk_len = x.shape[1]
    new_entries = key_value.entries_from_chunk(
        jax.lax.stop_gradient(k[:, -chunk_len:]), jax.lax.stop_gradient(v[:, -chunk_len:]),
        ctx.positions, ctx.segment_ids, ctx.valid)
    new_memory, _ = key_value.insert(memory, new_entries, FIFO)
    aux = {'knn_memory_fill': jnp.mean(memory.valid.astype(jnp.float32))}
    if gate is not None:
      aux['knn_gate'] = jnp.mean(gate)
    y = heads.output(out, self.shared.d_model, self.dtype)
    return y, {'local': new_local, 'knn': new_memory}, aux

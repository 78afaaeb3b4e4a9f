"""Routing Transformer attention (Roy et al., 2021, "Efficient Content-Based Sparse Attention
with Routing Transformers").

Content-based sparse attention: tokens are clustered by online k-means
(`attention/routing/online_kmeans.py`) and attend only within their cluster. Heads
`[0, local_heads)` are local heads (causal or two-sided sliding window of
`local_window` positions, `core/sliding_window.py`), the rest routing heads,
as the paper combines them (sec. 5).

Routing heads share queries and keys (one projection z, as the Reformer's
shared-QK attention): a token's routing vector is unit(z) (section 4.1: on
the sphere), its cluster the nearest of the head's k centroids. Attention is
then within the cluster, causal and within the document, and balanced: the
tokens are sorted by (cluster, position) and a query sees the `window` keys
just before it in that order that are of its cluster (the `window` most
recent earlier tokens of its cluster and document; two-sided: also the
`window` after it), never itself unless it has no other key. Cost: one sort
and O(n * window) attention whatever the cluster sizes; with window = n / k
and k = sqrt(n) that is the paper's O(n^1.5). With clusters of at most
`window + 1` tokens this is exactly dense attention under a same-cluster
mask. (The paper balances by taking the top n/k tokens per centroid instead;
which tokens a centroid takes then depends on later tokens and on other
documents. Here a query's keys depend only on tokens at or before it of its
own document, so a causal model sees in training what it sees in generation,
and documents stay apart: docs/design.md, contract 2.)

The centroids `[routing heads, k, head_dim]` are model state, not
parameters: the Flax collection `model_state` (train/train_state.py), moved
by an exponential moving average of the routing vectors assigned to them
after every training chunk (only when the caller makes `model_state`
mutable and the context is not deterministic; evaluation reads them), and
checkpointed with the run. The commitment loss |unit(z) - SG(mu)|^2 is
reported as the aux loss `commitment_loss` (weighted by
`model.aux_loss_weights.commitment_loss`). Stateless across chunks.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import block_sparse, projections
from longformer_jax.attention.routing import online_kmeans
from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.attention.core.partial_softmax import softmax_part
from longformer_jax.attention.core.sliding_window import auto_block_size, blocked_window_attention
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import Section
from longformer_jax.layers.positional import apply_rotary


@dataclasses.dataclass(frozen=True)
class RoutingConfig(Section):
  """`config.model.routing`; causal or not is the shared `model.causal`."""
  num_clusters: int = 4           # k centroids per routing head
  window: int = 64                # keys of its own cluster a query sees on each allowed side
  local_heads: int = 2            # heads [0, local_heads) attend to a local window instead
  local_window: int = 64          # the local heads' one-sided window (positions)
  decay: float = 0.999            # lambda of the centroids' moving average
  rotary: bool = True             # RoPE on queries and keys (positions relative to the chunk)

  def validate(self, env) -> None:
    self.require(self.num_clusters >= 1, 'num_clusters', 'must be >= 1')
    self.require(self.window >= 1, 'window', 'must be >= 1')
    self.require(self.local_heads >= 0, 'local_heads', 'must be >= 0')
    self.require(self.local_window >= 1, 'local_window', 'must be >= 1')
    self.require(0.0 <= self.decay < 1.0, 'decay', 'must be in [0, 1)')
    if env is not None:
      heads = env.model.num_heads
      self.require(self.local_heads < heads, 'local_heads',
                   f'must be < model.num_heads={heads} (at least one routing head)')
      # The reversible stack re-applies each layer with its parameters alone.
      if env.model.stack == 'reversible':
        raise ConfigError('model.stack', "'reversible' does not carry model state, which "
                          "routing attention keeps its centroids in; use the standard stack")


def to_heads_major(x: jax.Array) -> jax.Array:
  """`[batch, n, heads, ...] -> [batch * heads, n, ...]`."""
  x = jnp.swapaxes(x, 1, 2)
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def routing_attention(q: jax.Array, k: jax.Array, v: jax.Array, clusters: jax.Array,
                      positions: jax.Array, segment_ids: jax.Array, valid: jax.Array, *,
                      window: int, causal: bool) -> jax.Array:
  """Attention within clusters, balanced by a window in (cluster, position) order.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    clusters: `[batch, n, heads]` int32, each token's cluster per head.
    positions, segment_ids, valid: `[batch, n]`; positions increase along the row.
    window: w, keys of its cluster a query sees on each allowed side.
  Returns:
    `[batch, n, heads, head_dim]` in v's dtype; a valid query with no other
    key attends to itself; invalid queries give zeros.
  """
  batch, n, heads, _ = q.shape
  rows = batch * heads
  per_head = lambda a: jnp.broadcast_to(a[:, None], (batch, heads, n)).reshape(rows, n)
  positions, segments, valid = per_head(positions), per_head(segment_ids), per_head(valid)
  clusters = to_heads_major(clusters)                                    # [bh, n]
  # Sort by (cluster, slot); padding last. A cluster's tokens are then contiguous, in order.
  # Padding takes cluster id k (none of the real ones), so that no real token shares it.
  num_clusters = jnp.max(clusters) + 1
  clusters = jnp.where(valid, clusters, num_clusters)
  slots = jnp.arange(n, dtype=jnp.int32)[None]
  order = jnp.argsort(clusters * n + slots, axis=1)
  inverse = jnp.argsort(order, axis=1)
  take = lambda a: jnp.take_along_axis(a, order.reshape(order.shape + (1,) * (a.ndim - 2)), axis=1)
  q_s, k_s, v_s = take(to_heads_major(q)), take(to_heads_major(k)), take(to_heads_major(v))
  meta = dict(cluster=take(clusters), position=take(positions), segment=take(segments),
              valid=take(valid), slot=jnp.broadcast_to(slots, (rows, n)))
  # Blocks of w sorted slots; a block's keys are its neighbours within w slots.
  padded = block_sparse.num_blocks_for(n, window) * window
  blocks = lambda a, fill=0: block_sparse.to_blocks(block_sparse.pad_length(a, padded, fill),
                                                    window)
  offsets = (-1, 0) if causal else (-1, 0, 1)
  keys = lambda a, fill=0: block_sparse.neighbour_blocks(blocks(a, fill), offsets, fill)
  q_b = blocks(q_s)                                                      # [bh, nb, w, d]
  k_b, v_b = keys(k_s), keys(v_s)                                        # [bh, nb, o*w, d]
  mq = {name: blocks(a)[..., :, None] for name, a in meta.items()}
  mk = {name: keys(a, False if name == 'valid' else 0)[..., None, :] for name, a in meta.items()}
  distance = mq['slot'] - mk['slot']
  allowed = (mq['valid'] & mk['valid'] & (mq['cluster'] == mk['cluster'])
             & (mq['segment'] == mk['segment'])
             & (distance != 0) & (jnp.abs(distance) <= window))
  if causal:
    allowed &= mk['position'] <= mq['position']
  logits = jnp.einsum('rbqd,rbkd->rbqk', q_b, k_b)
  weights, lse = softmax_part(logits, allowed)
  out = jnp.einsum('rbqk,rbkd->rbqd', weights.astype(v.dtype), v_b)
  alone = (~jnp.isfinite(lse) & mq['valid'][..., 0])[..., None]          # no other key: itself
  out = jnp.where(alone, blocks(v_s), out)
  out = block_sparse.from_blocks(out)[:, :n]
  out = jnp.take_along_axis(out, inverse[..., None], axis=1)             # back to slot order
  return jnp.swapaxes(out.reshape(batch, heads, n, -1), 1, 2)


class RoutingAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, aux)`.

  aux: `commitment_loss` (when there are routing heads). Fields: `config` (`RoutingConfig`,
  the layer's `model.routing`), `shared` (`SharedSettings`: heads, `causal`), `dtype`.
  """
  Config = RoutingConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: RoutingConfig = RoutingConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: RoutingConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless across chunks (the centroids are model state, not memory)."""
    return {}

  def centroids(self) -> nn.Variable:
    """`[routing heads, clusters, head_dim]` unit vectors, random at initialisation."""
    shape = (self.shared.num_heads - self.config.local_heads, self.config.num_clusters,
             self.shared.head_dim)
    return self.variable(MODEL_STATE, 'centroids', lambda: online_kmeans.unit(
        jax.random.normal(self.make_rng('params'), shape)))

  def local_attention(self, x, q, v, ctx: AttentionContext) -> jax.Array:
    """Heads `[0, local_heads)`: a sliding window over the chunk, `[b, c, local_heads, d]`."""
    config = self.config
    k = projections.project_heads(x, config.local_heads, self.shared.head_dim, 'key', self.dtype)
    if config.rotary:
      k = apply_rotary(k, ctx.positions - ctx.positions[:, :1])
    facts = (ctx.positions, ctx.segment_ids)
    out, _ = blocked_window_attention(q, k, v, *facts, *facts, ctx.valid,
                                      window=config.local_window,
                                      block_size=auto_block_size(config.local_window),
                                      causal=self.shared.causal)
    return out

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    z = projections.project_heads(x, shared.num_heads, shared.head_dim, 'query', self.dtype)
    v = projections.project_heads(x, shared.num_heads, shared.head_dim, 'value', self.dtype)
    rotated = apply_rotary(z, ctx.positions - ctx.positions[:, :1]) if config.rotary else z
    q = rotated / jnp.asarray(math.sqrt(shared.head_dim), self.dtype)
    split = config.local_heads
    outputs, aux = [], {}
    if split:
      outputs.append(self.local_attention(x, q[:, :, :split], v[:, :, :split], ctx))
    if split < shared.num_heads:
      mu = self.centroids()
      route = online_kmeans.unit(z[:, :, split:])                          # [b, c, R, d]
      clusters = online_kmeans.nearest_centroid(jax.lax.stop_gradient(route), mu.value)
      outputs.append(routing_attention(
          q[:, :, split:], rotated[:, :, split:], v[:, :, split:], clusters, ctx.positions,
          ctx.segment_ids, ctx.valid, window=config.window, causal=shared.causal))
      aux['commitment_loss'] = online_kmeans.commitment_loss(route, mu.value, clusters, ctx.valid)
      if (self.is_mutable_collection(MODEL_STATE) and not ctx.deterministic
          and not self.is_initializing()):
        mu.value = online_kmeans.ema_update(mu.value, route, clusters, ctx.valid, config.decay)
    out = jnp.concatenate(outputs, axis=2) if len(outputs) > 1 else outputs[0]
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, aux

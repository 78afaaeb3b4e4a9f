"""Performer attention, FAVOR+ (Choromanski et al., 2021): the layer, its settings and state.

The linear-attention kernel (random features, numerical shifts, the causal block scan and
the bidirectional pair of scans) is `attention/performer/kernel.py`.

Memory across chunks (docs/design.md, contracts 1 and 4): causal Performer is
an RNN; with `carry_state` (default) the carry is the variant's state
(`PerformerState`, stop-gradient between chunks), cleared for rows flagged
`reset`, after a feature redraw, and unseen by queries of another document.
Bidirectional attention is stateless: a forward scan (keys at or before the
query) plus a backward scan (keys after it) of the same blocks, so documents
inside a chunk stay apart.

Features come from an explicit key: `fold_in(PRNGKey(seed), crc32(module
path))`, fixed per layer, identical in training and evaluation (under
`scan_layers` every layer has the same path, hence the same features). With
`redraw_every = r > 0` training step t uses `fold_in(fixed, t // r)` (the
fixed key itself for t < r; the step comes from `ctx.step`); deterministic
calls (evaluation) always use the fixed features. Queries and keys are
rotated by RoPE at their absolute stream positions (`rotary`), so carried
keys and new queries share one frame.
"""

import dataclasses
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.core import projections
from longformer_jax.attention.performer import random_features
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.performer.kernel import (KERNELS, RELU_EPS, PerformerState,
                                                       bidirectional_performer_attention,
                                                       causal_performer_attention, empty_state)
from longformer_jax.config.section import Section
from longformer_jax.layers.positional import apply_rotary


@dataclasses.dataclass(frozen=True)
class PerformerConfig(Section):
  """`config.model.performer`; causal or not is the shared `model.causal`."""
  num_features: int = 256         # m random features per layer (shared by the heads)
  kernel: str = 'softmax'         # softmax: positive features (FAVOR+) | relu: relu(Wx) + eps
  feature_norm: str = 'chi'       # row norms of W: chi (unbiased) | sqrt_d (fixed length)
  block_len: int = 64             # causal: exact attention inside blocks, prefix sums across
  redraw_every: int = 0           # redraw features every N training steps; 0: never
  seed: int = 0                   # fixed features per layer from this seed
  carry_state: bool = True        # causal: carry S, z from chunk to chunk (False: stateless)
  rotary: bool = True             # RoPE on q and k at absolute positions
  relu_eps: float = RELU_EPS      # kernel='relu': eps added to every feature

  def validate(self, env) -> None:
    self.require(self.num_features >= 1, 'num_features', 'must be >= 1')
    self.require(self.kernel in KERNELS, 'kernel', f'must be one of {list(KERNELS)}')
    self.require(self.feature_norm in random_features.FEATURE_NORMS, 'feature_norm',
                 f'must be one of {list(random_features.FEATURE_NORMS)}')
    self.require(self.block_len >= 1, 'block_len', 'must be >= 1')
    self.require(self.redraw_every >= 0, 'redraw_every', 'must be >= 0 (0: never redraw)')
    self.require(self.seed >= 0, 'seed', 'must be >= 0')
    self.require(self.relu_eps > 0, 'relu_eps', 'must be > 0 (keeps the normaliser positive)')
    self.require(self.kernel == 'relu' or self.relu_eps == RELU_EPS, 'relu_eps',
                 "is read only by kernel='relu'")


class PerformerAttention(nn.Module):
  """`__call__(x [b, c, d_model], state, ctx) -> (y [b, c, d_model], state, {})`.

  State: `PerformerState` (causal with `carry_state`), else `{}`. Fields: `config`
  (`PerformerConfig`, the layer's `model.performer`), `shared` (`SharedSettings`: heads,
  `causal`), `dtype`.
  """
  Config = PerformerConfig
  reads_mem_len = False           # the carry is S and z, not a cache of mem_len states

  shared: SharedSettings
  config: PerformerConfig = PerformerConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: PerformerConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Zero sums (float32 whatever `dtype`; `[batch_size, num_heads, num_features, ...]`,
    performer/kernel.py) when causal with `carry_state`, else `{}`."""
    del dtype
    if not shared.causal or not config.carry_state:
      return {}
    return empty_state(batch_size, shared.num_heads, config.num_features, shared.head_dim)

  def feature_period(self, ctx: AttentionContext) -> jax.Array:
    """int32 scalar: step // redraw_every in training, 0 (the fixed features) otherwise."""
    if self.config.redraw_every == 0 or ctx.deterministic or ctx.step is None:
      return jnp.zeros((), jnp.int32)
    return jnp.asarray(ctx.step, jnp.int32) // self.config.redraw_every

  def feature_key(self, period: jax.Array) -> jax.Array:
    """fold_in(PRNGKey(seed), crc32(module path)) for period 0, folded with the period after."""
    path = '/'.join(str(part) for part in self.scope.path)
    fixed = jax.random.fold_in(jax.random.PRNGKey(self.config.seed), zlib.crc32(path.encode()))
    return jnp.where(period == 0, fixed, jax.random.fold_in(fixed, period))

  def incoming_carry(self, state, ctx: AttentionContext, batch: int,
                     period: jax.Array) -> PerformerState:
    """The state as the first block's carry: cleared on reset or a new feature draw."""
    config, shared = self.config, self.shared
    if not config.carry_state:
      return empty_state(batch, shared.num_heads, config.num_features, shared.head_dim)
    return state.replace(
        sums=jax.lax.stop_gradient(state.sums),
        normaliser=jax.lax.stop_gradient(state.normaliser),
        valid=state.valid & ~ctx.reset & (state.period == period))

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    heads = lambda name: projections.project_heads(x, shared.num_heads, shared.head_dim, name,
                                                   self.dtype)
    q, k, v = heads('query'), heads('key'), heads('value')
    if config.rotary:
      q, k = apply_rotary(q, ctx.positions), apply_rotary(k, ctx.positions)
    period = self.feature_period(ctx)
    features = random_features.random_feature_matrix(
        self.feature_key(period), config.num_features, shared.head_dim, config.feature_norm)
    self.sow('intermediates', 'features', features)
    facts = (ctx.positions, ctx.segment_ids, ctx.valid, features)
    if shared.causal:
      carry = self.incoming_carry(state, ctx, x.shape[0], period)
      out, carry = causal_performer_attention(q, k, v, *facts, carry, kernel=config.kernel,
                                              block_len=config.block_len,
                                              relu_eps=config.relu_eps)
      if config.carry_state:
        state = carry.replace(period=jnp.broadcast_to(period, carry.period.shape))
    else:
      out = bidirectional_performer_attention(q, k, v, *facts, kernel=config.kernel,
                                              block_len=config.block_len,
                                              relu_eps=config.relu_eps)
    out = nn.with_logical_constraint(out.astype(self.dtype),
                                     ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}

"""How a layer projects and positions its heads: the shared settings of imported checkpoints.

The vanilla attention and the eval-time memories (Attendre, kNN memory,
StreamingLLM sinks) read the same projections (`query`, `key`, `value`,
`out`), so a checkpoint trained with one (or imported: docs/import.md) runs
with any of them. These settings, all in `config.model`, shape those
projections and their positions:

- `num_kv_heads`: grouped-query attention (Ainslie et al., 2023): key/value
  heads, each read by `num_heads / num_kv_heads` query heads. Keys and values
  are repeated to `num_heads` right after projection, so memories store
  `[.., num_heads, head_dim]` like any other layer's.
- `qkv_bias`, `out_bias`: biases on the q/k/v and output projections.
- `position_embedding`: 'rotary' rotates q and k (RoPE, half-split pairs);
  'learned' leaves them unrotated (the model adds absolute positions to its
  input; the layer's `rope_max_distance` cap then has nothing to cap);
  'relative_buckets' (T5) leaves them unrotated and adds a learned bias per
  (bucket of `k - q`, head) to the logits, `relative_num_buckets` buckets up to
  `relative_max_distance` (core/relative_buckets.py; the vanilla attention only).
- `rope_theta`, `rope_scaling`: the rotary frequencies and the factor on cos and sin
  (layers/positional.py). Dynamic NTK and LongRoPE depend on the sequence length: a layer
  passes `extent(ctx.positions, ctx.valid)` (per row, 1 + the largest valid position of the
  chunk) to `rotate` and `scores`, and rotates every key it attends to (cached ones too)
  with the frequencies of that extent.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core import projections
from longformer_jax.attention.core.relative_buckets import RelativePositionBias
from longformer_jax.layers.capped_rotary import capped_rotary_scores, rotary_scores
from longformer_jax.layers.positional import (LENGTH_DEPENDENT, apply_rotary,
                                              rotary_attention_factor, rotary_extent,
                                              rotary_inv_freq)


@dataclasses.dataclass(frozen=True)
class CheckpointHeads:
  """The settings above as one hashable module field, every one required: their defaults are
  `ModelConfig`'s (models/model_settings.py), read by `SharedSettings.of`
  (attention/shared_settings.py), which builds this."""
  num_kv_heads: int                # 0: num_heads (no grouping)
  qkv_bias: bool
  out_bias: bool
  rotary: bool                     # False: position_embedding 'learned' or 'relative_buckets'
  rope_theta: float
  rope_scaling: tuple              # sorted (key, value) pairs of model.rope_scaling
  relative_num_buckets: int        # > 0: position_embedding 'relative_buckets'
  relative_max_distance: int

  def inv_freq(self, head_dim: int, extent: jax.Array | None = None):
    """`[head_dim / 2]` rotary frequencies (`[batch, head_dim / 2]` for the length-dependent
    scalings, given `extent`), or None for the default base without scaling
    (`apply_rotary`'s own default, bit for bit)."""
    if not self.rope_scaling and self.rope_theta == 10000.0:
      return None
    return rotary_inv_freq(head_dim, self.rope_theta, dict(self.rope_scaling), extent)

  @property
  def attention_factor(self) -> float:
    """The factor on cos and sin (YaRN, LongRoPE; 1 otherwise)."""
    return rotary_attention_factor(dict(self.rope_scaling))

  def extent(self, positions: jax.Array, valid: jax.Array) -> jax.Array | None:
    """int32 `[b]` sequence lengths of a chunk at `positions [b, l]` (`valid [b, l]`) when the
    frequencies depend on them (dynamic, longrope; layers/positional.rotary_extent), else None."""
    if not self.rotary or dict(self.rope_scaling).get('type') not in LENGTH_DEPENDENT:
      return None
    return rotary_extent(positions, valid)

  def query(self, x: jax.Array, num_heads: int, head_dim: int, dtype) -> jax.Array:
    """`x [b, l, d_model]` -> `[b, l, num_heads, head_dim]` (scope `query`), unrotated."""
    return projections.project_heads(x, num_heads, head_dim, 'query', dtype, self.qkv_bias)

  def keys_values(self, x: jax.Array, num_heads: int, head_dim: int,
                  dtype) -> tuple[jax.Array, jax.Array]:
    """`x [b, l, d_model]` -> `(k, v)`, each `[b, l, num_heads, head_dim]` (scopes `key`,
    `value`), unrotated; grouped heads repeated so that query head h reads group h // g."""
    kv_heads = self.num_kv_heads or num_heads
    k = projections.project_heads(x, kv_heads, head_dim, 'key', dtype, self.qkv_bias)
    v = projections.project_heads(x, kv_heads, head_dim, 'value', dtype, self.qkv_bias)
    if kv_heads != num_heads:
      group = num_heads // kv_heads
      k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    return k, v

  def output(self, out: jax.Array, d_model: int, dtype) -> jax.Array:
    """`[b, l, heads, head_dim]` -> `[b, l, d_model]` (scope `out`)."""
    return projections.project_output(out, d_model, dtype, self.out_bias)

  def rotate(self, x: jax.Array, positions: jax.Array, extent: jax.Array | None = None
             ) -> jax.Array:
    """`x [b, l, heads, head_dim]` rotated at `positions [b, l]` (unchanged without RoPE);
    `extent [b]`: `self.extent` of the chunk (dynamic, longrope)."""
    if not self.rotary:
      return x
    return apply_rotary(x, positions, inv_freq=self.inv_freq(x.shape[-1], extent),
                        attention_factor=self.attention_factor)

  def position_bias(self, q_positions: jax.Array, k_positions: jax.Array, num_heads: int,
                    bidirectional: bool) -> jax.Array | None:
    """float32 `[b, heads, q, k]` learned relative bias of keys at `k_positions [b, k]` for
    queries at `q_positions [b, q]` (scope `relative_attention_bias`), to add to the logits;
    None unless `position_embedding='relative_buckets'`."""
    if not self.relative_num_buckets:
      return None
    return RelativePositionBias(self.relative_num_buckets, self.relative_max_distance, num_heads,
                                bidirectional, name='relative_attention_bias')(
                                    q_positions, k_positions)

  def scores(self, q: jax.Array, k: jax.Array, q_positions: jax.Array, k_positions: jax.Array,
             max_distance: int = -1, bidirectional: bool = False,
             extent: jax.Array | None = None) -> jax.Array:
    """Unscaled `[b, heads, q, k]` scores of unrotated `q [b, q, h, d]`, `k [b, k, h, d]`:
    RoPE with distances capped at `max_distance` (layers/capped_rotary.py; -1: no cap),
    or plain dot products without RoPE; `extent [b]` as in `rotate`."""
    if not self.rotary:
      return rotary_scores(q, k)
    return capped_rotary_scores(q, k, q_positions, k_positions, max_distance, bidirectional,
                                inv_freq=self.inv_freq(q.shape[-1], extent),
                                attention_factor=self.attention_factor)

"""Longformer's global attention (Beltagy et al., 2020, section 3.1), O(n·g).

Tokens flagged in `ctx.global_flags` (at most g =
`model.longformer.global_tokens` per row, the first g flagged valid tokens of
the chunk; the number of flagged tokens beyond g is reported as the
`global_tokens_dropped` statistic):

- every query also attends to the global tokens (with the local Q_s, K_s,
  V_s, in one softmax with its window, as in the original and Hugging Face
  code); a global key is counted once (it is removed from the window part);
- a global token's own row attends to every key of `[cache; chunk]` with
  separate projections Q_g, K_g, V_g, whose initial values are copies of Q_s,
  K_s, V_s.

Causal layers keep causality: a query sees only global tokens at or before
it, and a global token attends to keys at or before it. Document and padding
rules apply as everywhere.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp


def first_global_slots(flags: jax.Array, max_tokens: int) -> tuple[jax.Array, jax.Array]:
  """`flags [b, L]` bool -> `(slots [b, g] int32, found [b, g] bool)`, in order of position.

  Unused entries have slot `L` (out of range) and `found` False.
  """
  length = flags.shape[1]
  slots = jax.vmap(lambda row: jnp.nonzero(row, size=max_tokens, fill_value=length)[0])(flags)
  return slots.astype(jnp.int32), slots < length


def gather_slots(x: jax.Array, slots: jax.Array) -> jax.Array:
  """`x [b, L, ...]` at `slots [b, g]` (clipped into range) -> `[b, g, ...]`."""
  safe = jnp.clip(slots, 0, x.shape[1] - 1)
  return jax.vmap(lambda row, idx: row[idx])(x, safe)


def scatter_slots(x: jax.Array, slots: jax.Array, rows: jax.Array) -> jax.Array:
  """Writes `rows [b, g, ...]` into `x [b, L, ...]` at `slots`; out-of-range slots are dropped."""
  return jax.vmap(lambda row, idx, new: row.at[idx].set(new, mode='drop'))(x, slots, rows)


def global_key_flags(slots: jax.Array, length: int) -> jax.Array:
  """`[b, L]` bool: the slots that are global keys (the found ones)."""
  flags = jnp.zeros((slots.shape[0], length), bool)
  return scatter_slots(flags, slots, jnp.ones(slots.shape, bool))


class InitialisedFromProjection(nn.Module):
  """A `[*in] -> [*out]` projection whose kernel starts as a copy of `source_kernel`.

  Longformer's Q_g, K_g, V_g are initialised from Q_s, K_s, V_s (section 3.1
  and the released conversion code); the copy is made at `init` time and the
  two kernels train separately afterwards.
  """
  kernel_axes: tuple
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """`x [b, l, d]` -> `[b, l, heads, head_dim]`; `kernel`, `bias`: the local projection's."""
    copy = lambda source, axes: nn.with_logical_partitioning(
        lambda rng, shape: jnp.asarray(source, jnp.float32), axes)
    own_kernel = self.param('kernel', copy(kernel, self.kernel_axes), kernel.shape)
    y = jnp.einsum('bld,dhe->blhe', x.astype(self.dtype), own_kernel.astype(self.dtype))
    if bias is not None:  # a projection with a bias (imported checkpoints) copies it too
      y = y + self.param('bias', copy(bias, self.kernel_axes[1:]), bias.shape).astype(self.dtype)
    return y

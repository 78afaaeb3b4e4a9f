"""Reformer LSH attention (Kitaev et al., 2020, sec. 2-3).

Shared-QK attention whose keys are the length-normalised queries. Each token
is hashed by random rotations, h(x) = argmax([xR; -xR]) (Andoni et al., 2015;
Reformer eq. in sec. 2.2), in `num_hashes` independent rounds. In each round
the tokens are sorted by (bucket, position) and cut into chunks of
`chunk_len`; a query attends to keys of its own bucket in its own chunk and
the previous one,

  P_i = {j : h(q_i) = h(k_j),  floor(s_i / m) - 1 <= floor(s_j / m) <= floor(s_i / m)}

(s: the sorted index, m: the chunk length; the first chunk of a round has no
previous chunk), intersected with the usual causal / document / padding rule
of `masking.py` (a function of positions and segment ids). A token attends
to itself only when nothing else is available: its own key's logit is
replaced by `SELF_LOGIT` = -1e5 (as in trax and Hugging Face), which gives it
weight exactly 0 in float32 next to any other allowed key, in any round.
Rounds are combined by their log-sum-exp (sec. 2.3, multi-round LSH):

  o_i = sum_r exp(lse_r(i) - logsumexp_r lse_r(i)) o_r(i),

i.e. a softmax over the multiset union of the rounds' key sets (a key that
shares a bucket with the query in several rounds counts once per round).
Work and memory are O(n * num_hashes * chunk_len), never n x n.

Implementation (timings: docs/benchmarks.md, "Reformer LSH: scan over chunks"):
  * hashing `HASH_BLOCK` tokens at a time (`lax.map`), the argmax taken as
    max/min of xR without concatenating [xR; -xR];
  * one sort of one int32 key per head, bucket * n + rank, with tokens ranked
    by (position, slot) once per sequence (the (bucket, position, slot) order;
    a payload sort when the key would overflow int32);
  * the rounds' sorted rows laid out step-major, `[steps, batch * heads,
    G * chunk_len]`, gathered straight from the `[batch * n * heads]` token
    rows (q and v side by side in one gather; keys normalised after sorting).
    The gather's VJP sums one gather per round by the inverse permutation
    (no scatter-add);
  * `attention/lsh/chunk_scan.py` scans over groups of G sorted chunks
    (`rows_per_step`), holding one step's `[batch * heads, G, m, 2m]` scores
    in cache and recomputing them in the backward pass, and returns each
    row's output and log-sum-exp;
  * outputs and log-sum-exps back to token order by one gather (inverse
    permutation), rounds merged by their log-sum-exp.

Logits are q_i . k_j / sqrt(head_dim) with k_j = q_j / |q_j| by default
(`model.lsh.logit_scale='inverse_sqrt_head_dim'`). trax and Hugging Face
use q_i . k_j with no 1/sqrt(head_dim) (the keys have unit length); that is
`logit_scale='none'`. The two are different parametrisations: with the
default, attention is sqrt(head_dim) times flatter at initialisation, and
weights imported from trax or Hugging Face need `'none'` to give their outputs.

Settings: `config.model.lsh` (`LSHConfig`); causal or not is the shared
`model.causal`. Random rotations come from an explicit key (`rotation_key`):
  * fixed (default): `fold_in(PRNGKey(model.lsh.seed), crc32(module path))`,
    different per layer and identical in training and evaluation. Under
    `scan_layers` every layer has the same path, hence the same rotations.
  * `model.lsh.rotations_per_step=True`: fresh rotations at every training
    step from the `dropout` rng; deterministic calls (evaluation) use the
    fixed rotations.
"""

import dataclasses
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core import projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.lsh.chunk_scan import lsh_chunk_attention
from longformer_jax.config.section import Section
from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.positional import apply_rotary

SELF_LOGIT = -1e5
HASH_BLOCK = 128       # tokens hashed per lax.map step
SINGLE_KEY_SORT_LIMIT = 2**31   # rounds * buckets * n below it: sort one int32 key
ROWS_PER_STEP = 512    # sorted rows (query slots) per scan step: 8 chunks of 64
# model.lsh.logit_scale: q . k_hat / sqrt(head_dim), or q . k_hat (trax / Hugging Face).
LOGIT_SCALES = ('inverse_sqrt_head_dim', 'none')


@dataclasses.dataclass(frozen=True)
class LSHConfig(Section):
  """`config.model.lsh`; causal or not is the shared `model.causal`."""
  num_hashes: int = 2             # hash rounds (n_rounds)
  num_buckets: int = 8            # buckets per round: argmax over [xR; -xR], so even
  chunk_len: int = 64             # m: a query sees its bucket in its own and the previous chunk
  seed: int = 0                   # fixed rotations per layer from this seed
  rotations_per_step: bool = False  # True: fresh rotations each training step (eval: fixed)
  rotary: bool = True             # RoPE on the shared QK vectors before hashing
  logit_scale: str = 'inverse_sqrt_head_dim'  # or 'none': no 1/sqrt(d) (trax, Hugging Face)

  def validate(self, env) -> None:
    self.require(self.num_hashes >= 1, 'num_hashes', 'must be >= 1 (hash rounds)')
    self.require(self.num_buckets >= 2 and self.num_buckets % 2 == 0, 'num_buckets',
                 'must be even and >= 2 (argmax over [xR; -xR])')
    self.require(self.chunk_len >= 1, 'chunk_len', 'must be >= 1')
    self.require(self.logit_scale in LOGIT_SCALES, 'logit_scale',
                 "must be 'inverse_sqrt_head_dim' (q . k_hat / sqrt(head_dim)) or 'none' "
                 "(q . k_hat, as trax and Hugging Face)")
    if env is not None:
      # A model chunk shorter than chunk_len is one LSH chunk; a longer one is cut into them.
      bad = [n for n in env.chunk_lens if n > self.chunk_len and n % self.chunk_len]
      self.require(not bad, 'chunk_len',
                   f'must divide every model chunk length longer than it (training phases, '
                   f'evaluation); {", ".join(map(str, bad))} is not a multiple')


def random_rotations(key: jax.Array, num_heads: int, head_dim: int, num_hashes: int,
                     num_buckets: int) -> jax.Array:
  """Gaussian rotations R `[heads, head_dim, num_hashes, num_buckets // 2]`."""
  return jax.random.normal(key, (num_heads, head_dim, num_hashes, num_buckets // 2), jnp.float32)


def _hash_block(vectors: jax.Array, rotations: jax.Array) -> jax.Array:
  """`[n, heads, head_dim]` -> `[heads, rounds, n]` int32.

  argmax([xR; -xR]) without the concatenation: the first maximum lies in xR
  when max(xR) >= -min(xR) (ties go to the first half, as argmax's), else it
  is the first minimum of xR, shifted by half the buckets.
  """
  rotated = jnp.einsum('nhd,hdrk->hrnk', vectors.astype(jnp.float32), rotations)
  top, bottom = jnp.max(rotated, axis=-1), jnp.min(rotated, axis=-1)
  return jnp.where(top >= -bottom, jnp.argmax(rotated, axis=-1),
                   rotated.shape[-1] + jnp.argmin(rotated, axis=-1)).astype(jnp.int32)


def hash_buckets(vectors: jax.Array, rotations: jax.Array,
                 block: int = HASH_BLOCK) -> jax.Array:
  """h(x) = argmax([xR; -xR]): `[batch, n, heads, head_dim]` -> `[b, heads, rounds, n]` int32.

  Computed `block` tokens at a time (`lax.map`), so that the rotated vectors
  `[heads, rounds, block, buckets]` stay in cache for the argmax (the whole
  `[b, heads, rounds, n, buckets]` at once is 2x slower on CPU at 16k).
  """
  batch, n, heads, head_dim = vectors.shape
  rounds = rotations.shape[2]
  if n % block or n == block:
    return jax.vmap(_hash_block, in_axes=(0, None))(vectors, rotations)
  blocks = vectors.reshape(batch * n // block, block, heads, head_dim)
  out = jax.lax.map(lambda x: _hash_block(x, rotations), blocks)   # [b * n / block, h, r, block]
  out = jnp.transpose(out.reshape(batch, n // block, heads, rounds, block), (0, 2, 3, 1, 4))
  return out.reshape(batch, heads, rounds, n)


@jax.custom_vjp
def gather_rounds(rows: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
  """`rows [T, ...]` picked by `index [P]` (each row once per round) -> `[P, ...]`.

  `inverse [rounds, T]`: where row t sits in round r (`index[inverse[r, t]] == t`). The
  VJP sums the rounds' gathers by `inverse` instead of scatter-adding (the transpose of
  a general gather), which is faster on CPU and keeps no zero-initialised buffer alive.
  """
  return jnp.take(rows, index, axis=0)


def _gather_rounds_fwd(rows, index, inverse):
  return jnp.take(rows, index, axis=0), (index, inverse)


def _gather_rounds_bwd(residuals, cotangent):
  index, inverse = residuals
  return (sum(jnp.take(cotangent, inverse[r], axis=0) for r in range(inverse.shape[0])),
          None, None)


gather_rounds.defvjp(_gather_rounds_fwd, _gather_rounds_bwd)


def _softmax_and_logsumexp(logits: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
  """Softmax weights and log-sum-exp along `axis`, float32.

  Entries are normalised by their (stop-gradient) maximum before the sum, so
  the weights stay exact when every logit is large, e.g. only the self key at
  `SELF_LOGIT` (float32 spacing at 1e5 is 0.008). A slice with every entry
  -inf gets weights 0 and log-sum-exp -inf, with zero gradient (no NaN).
  """
  top = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  unnormalised = jnp.exp(logits - top)
  total = jnp.sum(unnormalised, axis=axis, keepdims=True)
  nonempty = total > 0
  safe_total = jnp.where(nonempty, total, 1.0)
  lse = jnp.where(nonempty, jnp.log(safe_total) + top, -jnp.inf)
  return unnormalised / safe_total, jnp.squeeze(lse, axis)


def chunks_per_step(num_chunks: int, chunk_len: int, rows_per_step: int) -> int:
  """G: the most chunks (a divisor of `num_chunks`) whose rows fit in `rows_per_step`."""
  limit = max(1, rows_per_step // chunk_len)
  return max(g for g in range(1, min(limit, num_chunks) + 1) if num_chunks % g == 0)


def lsh_attention(qk: jax.Array, v: jax.Array, positions: jax.Array, segment_ids: jax.Array,
                  valid: jax.Array, rotations: jax.Array, *, chunk_len: int,
                  causal: bool, logit_scale: str = 'inverse_sqrt_head_dim',
                  rows_per_step: int = ROWS_PER_STEP) -> jax.Array:
  """Multi-round LSH attention (module docstring), O(n * rounds * chunk_len).

  Args:
    qk: `[batch, n, heads, head_dim]` shared query/key vectors.
    v: `[batch, n, heads, head_dim]` values.
    positions, segment_ids: `[batch, n]` int32; valid: `[batch, n]` bool.
    rotations: `[heads, head_dim, rounds, num_buckets // 2]`.
    chunk_len: m; n must be a multiple of it.
    causal: keys after the query are masked.
    logit_scale: 'inverse_sqrt_head_dim' (q . k_hat / sqrt(head_dim)) or 'none'
      (q . k_hat, trax / Hugging Face).
    rows_per_step: sorted rows (query slots) per scan step, rounded down to
      whole chunks that divide the rounds' chunks (at least one chunk).
  Returns:
    `[batch, n, heads, head_dim]` in `v`'s dtype; a query with no allowed key
    (e.g. padding) gets 0.
  """
  batch, n, heads, head_dim = qk.shape
  rounds, num_buckets = rotations.shape[2], 2 * rotations.shape[3]
  if n % chunk_len:
    raise ConfigError('model.lsh.chunk_len',
                      f'{chunk_len}: the attention length {n} is not a multiple of it')
  if logit_scale not in LOGIT_SCALES:
    raise ConfigError('model.lsh.logit_scale',
                      f"{logit_scale!r} must be one of {', '.join(map(repr, LOGIT_SCALES))}")
  # Buckets of different rounds never meet: offset them by round * num_buckets,
  # then sort all rounds at once by (bucket, position, slot). Tokens ranked by
  # (position, slot) once per sequence make that one int32 key,
  # bucket * n + rank, sorted alone (a single-operand sort is ~6x faster on
  # CPU than a sort carrying payloads); slots are decoded from the ranks.
  buckets = hash_buckets(jax.lax.stop_gradient(qk), rotations)
  buckets += (jnp.arange(rounds, dtype=jnp.int32) * num_buckets)[:, None]
  shape = (batch, heads, rounds * n)
  arange_n = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
  if rounds * num_buckets * n < SINGLE_KEY_SORT_LIMIT:
    _, slot_of_rank = jax.lax.sort((positions, arange_n), dimension=1, num_keys=2)  # [b, n]
    rank = jnp.zeros_like(arange_n).at[jnp.arange(batch)[:, None], slot_of_rank].set(
        arange_n, unique_indices=True)
    key = buckets * n + rank[:, None, None, :]
    key = jax.lax.sort(key.reshape(shape), dimension=2)
    sorted_buckets = key // n
    sorted_slots = jnp.take_along_axis(slot_of_rank[:, None, :], (key % n).reshape(
        batch, 1, heads * rounds * n), axis=2).reshape(shape)
  else:
    slots = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32),
                             (batch, heads, rounds, n)).reshape(shape)
    row_positions = jnp.broadcast_to(positions[:, None, None, :], (batch, heads, rounds, n))
    sorted_buckets, _, sorted_slots = jax.lax.sort(
        (buckets.reshape(shape), row_positions.reshape(shape), slots), dimension=2, num_keys=3)

  # Sorted rows, step-major: [steps, batch * heads, G * m]; step s holds chunks
  # s * G .. s * G + G - 1 of the rounds laid end to end.
  num_chunks = rounds * n // chunk_len
  group = chunks_per_step(num_chunks, chunk_len, rows_per_step)
  steps = num_chunks // group

  def step_major(rows):  # [b, h, rounds * n] -> [steps, b * h, G * m]
    rows = rows.reshape(batch * heads, steps, group * chunk_len)
    return jnp.swapaxes(rows, 0, 1)

  # Token rows of `[batch, n, heads, d]` flattened: (b * n + slot) * heads + head.
  tokens = batch * n * heads
  token_of = ((jnp.arange(batch, dtype=jnp.int32)[:, None, None] * n + sorted_slots) * heads
              + jnp.arange(heads, dtype=jnp.int32)[None, :, None])
  round_of = jnp.arange(rounds * n, dtype=jnp.int32) // n
  index = step_major(token_of).reshape(-1)                                 # [P]
  round_row = step_major(round_of * tokens + token_of).reshape(-1)         # [P] -> r * T + t
  total = index.shape[0]
  inverse = jnp.zeros(total, jnp.int32).at[round_row].set(
      jnp.arange(total, dtype=jnp.int32), unique_indices=True)               # [rounds * T]
  inverse_by_round = inverse.reshape(rounds, tokens)

  def sort_facts(per_token):  # [b, n] -> [steps, b * h, G * m]
    return jnp.take(per_token.reshape(-1), index // heads).reshape(
        steps, batch * heads, group * chunk_len)

  # One gather of [qk, v] side by side; the keys k = q / |q| are normalised
  # after sorting (row-wise, so the same rows).
  rows = jnp.concatenate([qk, v.astype(qk.dtype)], axis=-1).reshape(tokens, 2 * head_dim)
  rows = gather_rounds(rows, index, inverse_by_round).reshape(
      steps, batch * heads, group * chunk_len, 2 * head_dim)
  q_rows, v_rows = rows[..., :head_dim], rows[..., head_dim:].astype(v.dtype)
  k_rows = q_rows * jax.lax.rsqrt(
      jnp.maximum(jnp.sum(jnp.square(q_rows.astype(jnp.float32)), -1, keepdims=True),
                  1e-12)).astype(qk.dtype)
  facts = (sort_facts(positions), sort_facts(segment_ids), sort_facts(valid),
           step_major(sorted_buckets))
  scale = float(np.sqrt(np.float32(head_dim))) if logit_scale == 'inverse_sqrt_head_dim' \
      else None
  settings = (chunk_len, n // chunk_len, causal, scale, SELF_LOGIT)
  out, lse = lsh_chunk_attention(settings, q_rows, k_rows, v_rows, facts)

  # Back to token order, per round: [rounds, T, d] and [rounds, T].
  out = permute_rows(out.reshape(total, head_dim), inverse, round_row)
  lse = permute_rows(lse.reshape(total), inverse, round_row)
  out = out.reshape(rounds, tokens, head_dim)
  lse = lse.reshape(rounds, tokens)

  # Combine rounds by their log-sum-exp (a softmax over the union of key sets).
  round_weights, _ = _softmax_and_logsumexp(lse, axis=0)                 # [rounds, T]
  combined = jnp.sum(round_weights[..., None] * out, axis=0)             # [T, d]
  return combined.reshape(batch, n, heads, head_dim).astype(v.dtype)


@jax.custom_vjp
def permute_rows(array: jax.Array, order: jax.Array, inverse: jax.Array) -> jax.Array:
  """`array [L, ...]` -> rows `order [L]` (a permutation; `inverse` its inverse).

  The VJP gathers by the inverse permutation instead of scatter-adding (the
  transpose of a general gather), which is faster on CPU and keeps no
  zero-initialised scatter buffers alive.
  """
  return jnp.take(array, order, axis=0)


def _permute_rows_fwd(array, order, inverse):
  return jnp.take(array, order, axis=0), (order, inverse)


def _permute_rows_bwd(residuals, cotangent):
  order, inverse = residuals
  return jnp.take(cotangent, inverse, axis=0), None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


class LSHAttention(nn.Module):
  """`__call__(x [b, c, d_model], {}, ctx) -> (y [b, c, d_model], {}, {})`; stateless.

  Fields: `config` (`LSHConfig`, the layer's `model.lsh`), `shared` (`SharedSettings`: heads,
  `causal`), `dtype`.
  """
  Config = LSHConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: LSHConfig = LSHConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: LSHConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: LSH attends within the chunk."""
    return {}

  def rotation_key(self, ctx: AttentionContext) -> jax.Array:
    """Fixed per layer (config seed, module path), or fresh per training step."""
    if self.config.rotations_per_step and not ctx.deterministic:
      return self.make_rng('dropout')
    path = '/'.join(str(part) for part in self.scope.path)
    return jax.random.fold_in(jax.random.PRNGKey(self.config.seed), zlib.crc32(path.encode()))

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    qk = projections.project_heads(x, shared.num_heads, shared.head_dim, 'query_key', self.dtype)
    v = projections.project_heads(x, shared.num_heads, shared.head_dim, 'value', self.dtype)
    if config.rotary:
      qk = apply_rotary(qk, ctx.positions - ctx.positions[:, :1])
    rotations = random_rotations(self.rotation_key(ctx), shared.num_heads, shared.head_dim,
                                 config.num_hashes, config.num_buckets)
    out = lsh_attention(qk, v, ctx.positions, ctx.segment_ids, ctx.valid, rotations,
                        chunk_len=min(config.chunk_len, x.shape[1]), causal=shared.causal,
                        logit_scale=config.logit_scale)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}

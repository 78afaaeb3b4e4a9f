"""Positional signals: sinusoids (Vaswani et al., 2017) and rotary (Su et al., 2021).

Rotary frequencies (`rotary_inv_freq`) follow the shared settings
`model.rope_theta` (the base, 10000 by default) and `model.rope_scaling`, the
context-extension variants of released checkpoints, computed as Hugging Face
transformers computes them (`modeling_rope_utils`):

  {}                                  no scaling
  {type: linear, factor: f}           position interpolation (Chen et al., 2023):
                                      every frequency divided by f
  {type: llama3, factor: f, low_freq_factor: l, high_freq_factor: h,
   original_max_position_embeddings: n}
                                      Llama 3.1: wavelengths longer than n / l are
                                      divided by f, shorter than n / h kept, and
                                      those between interpolated smoothly
  {type: yarn, factor: f, original_max_position_embeddings: n, beta_fast: 32,
   beta_slow: 1, truncate: true, mscale, mscale_all_dim, attention_factor}
                                      YaRN (Peng et al., 2023): NTK-by-parts frequencies
                                      (frequencies turning more than beta_fast times
                                      within n kept, fewer than beta_slow times divided
                                      by f, a linear ramp between) and cos/sin times the
                                      attention factor (default 0.1 ln f + 1, or the ratio
                                      of that with mscale and mscale_all_dim when both
                                      are set and nonzero)
  {type: dynamic, factor: f, original_max_position_embeddings: n}
                                      dynamic NTK: the base grows to
                                      theta (f L / n - (f - 1))^(d / (d - 2)) once the
                                      sequence length L passes n (transformers' n is the
                                      checkpoint's max_position_embeddings)
  {type: longrope, short_factor: [d/2], long_factor: [d/2],
   original_max_position_embeddings: n, factor: f, attention_factor}
                                      LongRoPE (Ding et al., 2024): frequency i divided by
                                      long_factor[i] once L passes n, else by
                                      short_factor[i]; cos/sin times the attention factor
                                      (default sqrt(1 + ln f / ln n), 1 when f <= 1; at
                                      least one of factor, attention_factor is needed)

Dynamic and longrope depend on the sequence length L. A forward defines it per row as
`rotary_extent`: 1 + the largest valid position of the row in the chunk (positions
count from the start of the row's stream), and the chunk's queries and every key they
attend to, cached ones included, are rotated with the frequencies of that L. Fed a whole
text at once this is one transformers forward of the text. Past n, a chunked run or
key/value-cache decoding is close to it, not equal: deeper layers' cached keys come from
hidden states computed at their own, shorter L (docs/import.md, "RoPE scalings").
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

ROPE_SCALING_TYPES = ('linear', 'llama3', 'yarn', 'dynamic', 'longrope')
# The keys each type needs, and those it may leave out (their defaults: YARN_DEFAULTS, or
# derived as the module docstring says).
REQUIRED_KEYS = {
    'linear': ('factor',),
    'llama3': ('factor', 'low_freq_factor', 'high_freq_factor',
               'original_max_position_embeddings'),
    'yarn': ('factor', 'original_max_position_embeddings'),
    'dynamic': ('factor', 'original_max_position_embeddings'),
    'longrope': ('short_factor', 'long_factor', 'original_max_position_embeddings'),
}
OPTIONAL_KEYS = {
    'yarn': ('beta_fast', 'beta_slow', 'mscale', 'mscale_all_dim', 'attention_factor',
             'truncate'),
    'longrope': ('factor', 'attention_factor'),
}
YARN_DEFAULTS = {'beta_fast': 32.0, 'beta_slow': 1.0, 'truncate': True}
# Types whose frequencies depend on the sequence length (`rotary_extent`).
LENGTH_DEPENDENT = ('dynamic', 'longrope')


def sinusoid_embedding(distances: jax.Array, dim: int) -> jax.Array:
  """Transformer-XL's R: `[...]` distances -> float32 `[..., dim]`.

  Layout [sin(d * f_0..f_{dim/2-1}), cos(...)], f_i = 10000^(-2i/dim), as in
  the reference implementation of Dai et al. (2019).
  """
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  angles = distances.astype(jnp.float32)[..., None] * inv_freq
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def rope_scaling_error(scaling, head_dim: int = 0) -> str:
  """What is wrong with a `model.rope_scaling` mapping ('' when it is valid); `head_dim` > 0
  also checks the length of longrope's factor lists."""
  if not scaling:
    return ''
  kind = scaling.get('type')
  if kind not in ROPE_SCALING_TYPES:
    return f'type {kind!r} is not supported; choose one of {ROPE_SCALING_TYPES} (or {{}})'
  needed = REQUIRED_KEYS[kind]
  allowed = ('type',) + needed + OPTIONAL_KEYS.get(kind, ())
  for key in scaling:
    if key not in allowed:
      return f'unknown key {key!r} for type {kind!r}; expected {allowed}'
  for key in needed + OPTIONAL_KEYS.get(kind, ()):
    if key not in scaling and key not in needed:
      continue
    value = scaling.get(key)
    if key == 'truncate':
      if not isinstance(value, bool):
        return f'truncate must be true or false (got {value!r})'
    elif key in ('short_factor', 'long_factor'):
      problem = _factor_list_error(key, value, head_dim)
      if problem:
        return problem
    elif not _is_number(value) or value <= 0:
      return f'{key} must be a positive number (got {value!r})'
  if kind == 'llama3' and not scaling['high_freq_factor'] > scaling['low_freq_factor']:
    return 'high_freq_factor must be greater than low_freq_factor'
  if kind == 'longrope':
    if len(scaling['short_factor']) != len(scaling['long_factor']):
      return 'long_factor must have as many entries as short_factor'
    if 'factor' not in scaling and 'attention_factor' not in scaling:
      return ('factor (or attention_factor) is required for type longrope: the attention '
              'factor is sqrt(1 + ln factor / ln original_max_position_embeddings)')
    if ('attention_factor' not in scaling and scaling['factor'] > 1
        and scaling['original_max_position_embeddings'] <= 1):
      return 'original_max_position_embeddings must be > 1 (its log divides the attention factor)'
  return ''


def _factor_list_error(key: str, value, head_dim: int) -> str:
  if (not isinstance(value, (list, tuple)) or not value
      or not all(_is_number(v) and v > 0 for v in value)):
    return f'{key} must be a list of positive numbers, one per frequency (got {value!r})'
  if head_dim and len(value) != head_dim // 2:
    return f'{key} has {len(value)} entries; head_dim {head_dim} has {head_dim // 2} frequencies'
  return ''


def rotary_inv_freq(head_dim: int, theta: float = 10000.0, scaling=None, extent=None):
  """float32 `[head_dim / 2]`: the rotation frequencies f_i = theta^(-2i/head_dim), scaled.

  `scaling`: a `model.rope_scaling` mapping (module docstring); empty: none. Dynamic and
  longrope need `extent`, int `[batch]` sequence lengths (`rotary_extent`), and return
  float32 `[batch, head_dim / 2]` (a JAX array); the others ignore it (numpy).
  """
  half = head_dim // 2
  inv_freq = 1.0 / (np.float32(theta) ** (np.arange(half, dtype=np.float32) / np.float32(half)))
  scaling = dict(scaling or {})
  kind = scaling.get('type')
  if kind in LENGTH_DEPENDENT:
    if extent is None:
      raise ValueError(f'rope_scaling type {kind!r} needs the sequence length (extent)')
    if kind == 'dynamic':
      return _dynamic_inv_freq(head_dim, theta, scaling, extent)
    return _longrope_inv_freq(head_dim, theta, scaling, extent)
  if kind == 'linear':
    inv_freq = inv_freq / np.float32(scaling['factor'])
  elif kind == 'llama3':
    factor = float(scaling['factor'])
    low, high = float(scaling['low_freq_factor']), float(scaling['high_freq_factor'])
    context = float(scaling['original_max_position_embeddings'])
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    inv_freq = np.where(medium, smoothed, scaled)
  elif kind == 'yarn':
    inv_freq = _yarn_inv_freq(head_dim, theta, {**YARN_DEFAULTS, **scaling})
  return inv_freq.astype(np.float32)


def _base_powers(head_dim: int, theta: float) -> np.ndarray:
  """float32 `[head_dim / 2]` theta^(2i / head_dim), as transformers computes them."""
  return np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))


def _yarn_inv_freq(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
  """YaRN's "NTK-by-parts" interpolation (Peng et al., 2023, arXiv:2309.00071): with
  r(i) = n / lambda_i the turns of frequency i within the original context n, frequencies
  with r > beta_fast are kept (extrapolated), those with r < beta_slow divided by the
  factor (interpolated), and a linear ramp in the index i blends the two between."""
  factor, context = float(scaling['factor']), float(scaling['original_max_position_embeddings'])
  powers = _base_powers(head_dim, theta)
  extrapolated, interpolated = 1.0 / powers, 1.0 / (np.float32(factor) * powers)

  def index_of(turns: float) -> float:
    """The (fractional) index i at which frequency i turns `turns` times within n."""
    return head_dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

  low, high = index_of(float(scaling['beta_fast'])), index_of(float(scaling['beta_slow']))
  if scaling['truncate']:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, head_dim - 1)
  if low == high:
    high += 0.001                     # transformers' guard against a zero-width ramp
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  kept = 1 - ramp                     # the share of the original frequency
  return interpolated * (1 - kept) + extrapolated * kept


def _dynamic_inv_freq(head_dim: int, theta: float, scaling: dict, extent) -> jax.Array:
  """Dynamic NTK (emozilla, 2023; Peng et al., 2023, "Dynamic Scaling"): the "NTK-aware"
  base theta * s^(d / (d - 2)) with s = f L / n - (f - 1) for L = max(extent, n),
  float32 as transformers computes it -> `[batch, head_dim / 2]`."""
  factor, context = float(scaling['factor']), float(scaling['original_max_position_embeddings'])
  length = jnp.maximum(jnp.asarray(extent).astype(jnp.float32), context)
  base = theta * ((factor * length / context) - (factor - 1)) ** (head_dim / (head_dim - 2))
  exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
  return 1.0 / (base[:, None] ** exponents)


def _longrope_inv_freq(head_dim: int, theta: float, scaling: dict, extent) -> jax.Array:
  """LongRoPE (Ding et al., 2024): each frequency divided by its searched factor, the long
  ones for rows whose sequence passes n, the short ones else -> `[batch, head_dim / 2]`."""
  powers = _base_powers(head_dim, theta)
  short = 1.0 / (np.asarray(scaling['short_factor'], np.float32) * powers)
  long = 1.0 / (np.asarray(scaling['long_factor'], np.float32) * powers)
  longer = jnp.asarray(extent) > scaling['original_max_position_embeddings']
  return jnp.where(longer[:, None], long, short)


def rotary_attention_factor(scaling) -> float:
  """The factor on cos and sin (so on q and k; the logits get its square): YaRN's attention
  temperature, sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al., 2023), and LongRoPE's
  sqrt(1 + ln s / ln n) (Ding et al., 2024), or the mapping's `attention_factor`; 1 for the
  other types."""
  scaling = dict(scaling or {})
  kind = scaling.get('type')
  if kind not in ('yarn', 'longrope'):
    return 1.0
  if 'attention_factor' in scaling:
    return float(scaling['attention_factor'])
  factor = float(scaling['factor'])
  if kind == 'longrope':
    context = float(scaling['original_max_position_embeddings'])
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(context))

  def mscale(scale: float, weight: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

  if scaling.get('mscale') and scaling.get('mscale_all_dim'):   # DeepSeek's ratio
    return mscale(factor, scaling['mscale']) / mscale(factor, scaling['mscale_all_dim'])
  return mscale(factor)


def rotary_extent(positions: jax.Array, valid: jax.Array) -> jax.Array:
  """int32 `[batch]` sequence length of each row for the length-dependent scalings: 1 + the
  largest valid position of `positions [batch, length]` (0 for a row with none valid)."""
  return jnp.max(jnp.where(valid, positions, -1), axis=1).astype(jnp.int32) + 1


def apply_rotary(x: jax.Array, positions: jax.Array, base: float = 10000.0,
                 inv_freq=None, attention_factor: float = 1.0) -> jax.Array:
  """Rotates pairs of features by position-dependent angles (RoPE).

  The pairs are (i, i + head_dim/2), the half-split layout of GPT-NeoX and
  Hugging Face's `rotate_half`.

  Args:
    x: `[batch, length, heads, head_dim]`, head_dim even.
    positions: `[batch, length]` absolute positions.
    base: theta of f_i = theta^(-2i/head_dim) when `inv_freq` is None.
    inv_freq: optional `[head_dim / 2]` or per-row `[batch, head_dim / 2]` frequencies
      (`rotary_inv_freq`).
    attention_factor: multiplies cos and sin (YaRN, LongRoPE: `rotary_attention_factor`).
  Returns:
    `x` rotated, same shape and dtype. q·k then depends only on the position
    difference (Su et al., 2021, eq. 16), so caching hidden states and rotating
    them at their stored positions is exact.
  """
  half = x.shape[-1] // 2
  if inv_freq is None:
    inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) / half))
  else:
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    if inv_freq.ndim == 2:
      inv_freq = inv_freq[:, None, None, :]                       # [b, 1, 1, half]
  angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # [b, l, 1, half]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  if attention_factor != 1.0:
    sin, cos = sin * attention_factor, cos * attention_factor
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


def relative_shift(scores: jax.Array) -> jax.Array:
  """Transformer-XL's efficient relative shift (Dai et al., 2019, appendix B).

  Args:
    scores: `[batch, heads, q, k]` where column r holds the score for relative
      distance `k - 1 - r` (R laid out from the farthest distance to 0).
  Returns:
    `[batch, heads, q, k]` with `out[i, j] = scores[i, j + q - 1 - i]`: the
    score for distance `(k - q) + i - j` when the q queries are the last q
    of the k keys. Entries with j > (k - q) + i (future keys) are garbage and
    must be masked by the caller.
  """
  b, h, q, k = scores.shape
  padded = jnp.pad(scores, ((0, 0), (0, 0), (0, 0), (1, 0)))  # [b, h, q, k + 1]
  padded = padded.reshape(b, h, k + 1, q)[:, :, 1:]             # drop q entries
  return padded.reshape(b, h, q, k)

"""The next-token loss of a time-shifted stack: targets moved to where their logits come out.

A stack with Attendre's Q memory (`models/attendre_delay.py`) answers each query
D = `total_delay` positions late: the logits at slot t of a step belong to the
input at slot t - D. So the step's batch gets D more slots of padding at the end,
rounded up to whole chunks (the drain: positions continue, nothing valid, so no
key is added and no valid memory entry is displaced), and every per-target array
moves D slots right. Each target is then scored once, within the step that read
its input; the first D slots of a step answer the previous step's drain padding
and carry no target.

Under `causal=False` a delayed query sees the N keys after it, its own next
token among them, so the next-token loss would read its answers:
`require_causal` refuses it.
"""

import jax.numpy as jnp

from longformer_jax.config.errors import ConfigError
from longformer_jax.models.attendre_delay import drain_chunks, padding_positions

# Arrays indexed by the target (moved by D), against those indexed by the input.
TARGET_KEYS = ('targets', 'target_mask', 'subset_mask')


def require_causal(model_config, delay: int) -> None:
  """Refuses the next-token loss of a stack whose delayed queries see later keys."""
  if delay and not model_config.causal:
    raise ConfigError('model.causal', f'False with a Q memory (total delay {delay}): a delayed '
                      'query would see the token it predicts; the next-token loss needs '
                      'causal=True (the Q memory then changes when a query is answered, '
                      'not what it sees)')


def drained_batch(batch: dict, delay: int, chunk_len: int) -> dict:
  """`batch` (`[rows, T]` arrays, lm_objective's names) with the drain appended and the
  target arrays moved `delay` slots right: `[rows, T + pad]`, pad = D rounded up to whole
  chunks (`attendre_delay.finishing_lengths`' drain)."""
  if delay == 0:
    return batch
  pad = drain_chunks(delay, chunk_len) * chunk_len
  rows = batch['inputs'].shape[0]
  positions, segment_ids = padding_positions(jnp.asarray(batch['positions']),
                                             jnp.asarray(batch['segment_ids']), pad)
  padding = {
      'inputs': jnp.zeros((rows, pad), batch['inputs'].dtype),
      'positions': positions,
      'segment_ids': segment_ids,
      'doc_start': jnp.zeros((rows, pad), bool),
      'input_mask': jnp.zeros((rows, pad), bool),
  }
  out = {}
  for name, value in batch.items():
    value = jnp.asarray(value)
    if name in TARGET_KEYS:
      zeros = jnp.zeros((rows, delay) + value.shape[2:], value.dtype)
      tail = jnp.zeros((rows, pad - delay) + value.shape[2:], value.dtype)
      out[name] = jnp.concatenate([zeros, value, tail], axis=1)
    elif name in padding:
      out[name] = jnp.concatenate([value, padding[name]], axis=1)
    else:
      raise ValueError(f'the drain cannot place the batch array {name!r}: it is neither '
                       'an input nor a target array')
  return out


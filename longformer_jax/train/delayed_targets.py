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
token among them, so the next-token loss would read its answers. It is allowed
only where every layer is Attendre with `hide_predicted` (`require_hidden_targets`):
the batch then flags each input that is some slot's target (`predicted`, the
target mask moved one slot right) and those keys are hidden from the queries
before them, a prefix-LM mask: the delayed queries look ahead over the prompt
(Attendre's Q memory as the paper uses it) and never at what is predicted. With
every token a target (`data.loss_on='all'`) that is the causal mask. Slot 0 of a
step needs no flag: the drain answered every earlier query in the step before.
"""

import jax.numpy as jnp

from longformer_jax.config.errors import ConfigError
from longformer_jax.models.attendre_delay import drain_chunks, padding_positions
from longformer_jax.models.layer_schedule import layer_config

# Arrays indexed by the target (moved by D), against those indexed by the input.
TARGET_KEYS = ('targets', 'target_mask', 'subset_mask')


def require_hidden_targets(model_config, delay: int) -> bool:
  """Whether the loss must flag the predicted inputs (a delayed stack under causal=False);
  refuses one whose delayed queries would see the tokens they predict."""
  if not delay or model_config.causal:
    return False
  for i in range(model_config.num_layers):
    layer = layer_config(model_config, i)
    if layer.attention != 'attendre' or not layer.attendre.hide_predicted:
      raise ConfigError('model.causal', f'False with a Q memory (total delay {delay}): layer {i} '
                        'would let a query see the token it predicts; the next-token loss '
                        'needs causal=True, or every layer Attendre with '
                        'model.attendre.hide_predicted=True (look-ahead over the prompt only)')
  return True


def predicted_inputs(target_mask) -> jnp.ndarray:
  """`[rows, T]` bool: input t is the target of slot t - 1 (False at slot 0)."""
  target_mask = jnp.asarray(target_mask, bool)
  return jnp.pad(target_mask[:, :-1], ((0, 0), (1, 0)))


def drained_batch(batch: dict, delay: int, chunk_len: int, flag_predicted: bool = False) -> dict:
  """`batch` (`[rows, T]` arrays, lm_objective's names) with the drain appended and the
  target arrays moved `delay` slots right: `[rows, T + pad]`, pad = D rounded up to whole
  chunks (`attendre_delay.finishing_lengths`' drain). `flag_predicted` adds `predicted`
  (`predicted_inputs`, False on the drain)."""
  if delay == 0:
    return batch
  if flag_predicted:
    batch = dict(batch, predicted=predicted_inputs(batch['target_mask']))
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
      'predicted': jnp.zeros((rows, pad), bool),
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


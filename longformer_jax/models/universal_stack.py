"""Universal Transformer with Adaptive Computation Time (Dehghani et al., 2019; Graves, 2016).

One block, its parameters shared, is applied up to `act_max_steps` times.
Before each application the time-step coordinate is added to the state as
a sinusoid of the step index (the UT's "coordinate embedding": positions
are handled inside attention here). A halting unit gives every position a
probability p_t = sigmoid(w . s_t + b) per step (Graves, 2016, eq. 6);
a position halts at the first step whose cumulative probability would pass
1 - epsilon (or at the last step), and spends its remainder
R = 1 - sum of its earlier p there. The output is the mean-field update
(eq. 7 of Graves: the states weighted by p, and by R at the halting step):

  s <- w_t * block(s) + (1 - w_t) * s,  w_t = p_t (running), R (halting), 0 (halted)

so halted positions are copied unchanged. The ponder cost
rho = N + R (steps taken plus remainder, Graves eq. 11) is reported as the
aux loss `ponder_loss` (its mean over valid positions; weight
`model.aux_loss_weights.ponder_loss`, tau in the paper).

Each application step keeps its own memory (the shared block is applied at
`act_max_steps` depths), so the state is a tuple with one entry per step.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.attention.registry import attention_class
from longformer_jax.layers.linear import projection
from longformer_jax.layers.positional import sinusoid_embedding
from longformer_jax.models.block_registry import block_class


def act_step_weights(halting_sum, p, step: int, max_steps: int, threshold: float):
  """One ACT step: `(update_weights, halting_sum, remainder_add, step_add)`, all `[b, l]`.

  `halting_sum` is the cumulative halting probability of each position
  before this step (>= 1 once halted).
  """
  running = halting_sum < 1.0
  if step == max_steps - 1:
    halts_now = running                      # the last step halts everyone left
  else:
    halts_now = running & (halting_sum + p > threshold)
  keeps_running = running & ~halts_now
  remainder = jnp.where(halts_now, 1.0 - halting_sum, 0.0)
  weights = jnp.where(keeps_running, p, 0.0) + remainder
  new_sum = jnp.where(keeps_running, halting_sum + p, jnp.where(halts_now, 1.0, halting_sum))
  return weights, new_sum, remainder, running.astype(jnp.float32)


class UniversalTransformerACT(nn.Module):
  """`(x [batch, chunk, d_model], states (per step), ctx) -> (x, states, aux per step)`.

  Config keys: `act_max_steps`, `act_epsilon` (threshold 1 - epsilon,
  default 0.01), and `block` / `attention` for the shared block.
  """
  config: ml_collections.FrozenConfigDict
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config, batch_size: int, dtype=jnp.float32) -> tuple:
    one = attention_class(config.attention).init_state(config, batch_size, dtype)
    return tuple(one for _ in range(config.act_max_steps))

  @nn.compact
  def __call__(self, x: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    max_steps = cfg.act_max_steps
    threshold = 1.0 - cfg.get('act_epsilon', 0.01)
    block = block_class(cfg.get('block', 'pre_ln'))(cfg, self.dtype, name='shared_block')
    halting = projection(1, kernel_axes=('embed', None), name='halting', dtype=jnp.float32,
                         use_bias=True, bias_axes=(None,))
    batch, length = x.shape[:2]
    halting_sum = jnp.zeros((batch, length), jnp.float32)
    remainders = jnp.zeros((batch, length), jnp.float32)
    steps_taken = jnp.zeros((batch, length), jnp.float32)
    step_signal = sinusoid_embedding(jnp.arange(max_steps), cfg.d_model)
    new_states, auxes = [], []
    for step in range(max_steps):
      s = x + step_signal[step].astype(x.dtype)
      p = jax.nn.sigmoid(halting(s.astype(jnp.float32))[..., 0])
      weights, halting_sum, remainder, ran = act_step_weights(halting_sum, p, step, max_steps,
                                                              threshold)
      remainders += remainder
      steps_taken += ran
      transformed, (state, aux) = block(s, states[step], ctx)
      w = weights[..., None].astype(x.dtype)
      x = w * transformed + (1.0 - w) * x
      new_states.append(state)
      auxes.append(dict(aux))
    valid = ctx.valid.astype(jnp.float32)
    ponder = jnp.sum((steps_taken + remainders) * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    auxes[0]['ponder_loss'] = ponder
    auxes[0]['act_steps'] = jnp.sum(steps_taken * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    return x, tuple(new_states), tuple(auxes)

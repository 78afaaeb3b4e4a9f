"""Universal Transformer with Adaptive Computation Time (Dehghani et al., 2019; Graves, 2016).

One block, its parameters shared, is applied up to `max_steps` times.
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
`max_steps` depths), so the state is a tuple with one entry per step.

Settings: `config.model.universal_act` (`UniversalACTConfig`). The stack
applies one block with one config at every step, so `num_layers` is not
read, and a `layer_schedule`, `scan_layers` or a `remat_policy` (nothing
is rematerialised) are config errors.
"""

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import attention_state
from longformer_jax.config.section import Section
from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.linear import projection
from longformer_jax.layers.positional import sinusoid_embedding
from longformer_jax.models.block_registry import block_class

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel


@dataclasses.dataclass(frozen=True)
class UniversalACTConfig(Section):
  """`config.model.universal_act`: the ACT loop of `model.stack='universal_act'`."""
  max_steps: int = 4        # applications of the shared block (the most any position gets)
  epsilon: float = 0.01     # a position halts once its halting sum would pass 1 - epsilon

  def validate(self, env) -> None:
    self.require(self.max_steps >= 1, 'max_steps', 'must be >= 1')
    self.require(0.0 < self.epsilon < 1.0, 'epsilon', 'must be in (0, 1)')
    if env is None:
      return
    model = env.model
    if model.layer_schedule:
      raise ConfigError('model.layer_schedule', f'{model.layer_schedule!r}: the universal_act '
                        'stack applies one block config at every step; remove the schedule')
    if model.scan_layers:
      raise ConfigError('model.scan_layers', "True is ignored by stack='universal_act' "
                        '(it loops over its steps); set it to False')
    if model.remat_policy != 'none':
      raise ConfigError('model.remat_policy', f"{model.remat_policy!r} is ignored by "
                        "stack='universal_act'; set it to 'none'")


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

  Config: `config.universal_act` (`max_steps`, `epsilon`: threshold
  1 - epsilon), and `block` / `attention` for the shared block.
  """
  Config = UniversalACTConfig

  config: 'ResolvedModel'
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config, batch_size: int, dtype=jnp.float32) -> tuple:
    one = attention_state(config, batch_size, dtype)
    return tuple(one for _ in range(config.universal_act.max_steps))

  @nn.compact
  def __call__(self, x: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    max_steps = cfg.universal_act.max_steps
    threshold = 1.0 - cfg.universal_act.epsilon
    block = block_class(cfg.block)(cfg, self.dtype, name='shared_block')
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

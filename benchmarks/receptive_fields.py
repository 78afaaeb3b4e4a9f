"""Which inputs each final state of an encoder has read, measured from its own gradients.

A state depends on an input position exactly where the attention pattern, composed over
the layers, joins them: a key outside every query's pattern gets weight 0 and gradient 0.
So the field of state j is the set of positions i where d(r . h_j) / d x_i is not zero, for
a random direction r over `d_model` (zero with probability 0 where h_j does depend on
x_i). One vector-Jacobian product per state, in batches; no attention code is read, so the
measurement holds for every variant alike (for the content-dependent ones, Reformer's
buckets and Routing's clusters, at the given input and initialisation).

`tests/benchmarks/test_pathfinder_reach.py` holds it to the interval l w a sliding window
reaches after l layers.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from configs import lra
from longformer_jax.config.overrides import with_overrides
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.encoder import Encoder, encoder_context
from longformer_jax.models.resolved_model import encoder_model_config


def state_fields(model_config, valid: np.ndarray, global_flags: np.ndarray, *,
                 seed: int = 0, batch: int = 32) -> np.ndarray:
  """`bool [length, length]`: row j holds the positions whose input embedding the final
  state j of `Encoder(model_config)` depends on, for one example with `valid [length]`
  and `global_flags [length]`, random embeddings and a random initialisation (`seed`)."""
  length = valid.shape[0]
  encoder = Encoder(model_config, jnp.float32)
  ctx = encoder_context(jnp.asarray(valid)[None], jnp.asarray(global_flags)[None], True)
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(keys[0], (1, length, model_config.d_model))
  params = encoder.init(keys[1], x, ctx)
  direction = jax.random.normal(keys[2], (model_config.d_model,))

  def states(x):
    return encoder.apply(params, x, ctx)[0][0]                   # [length, d_model]

  _, pullback = jax.vjp(states, x)              # one forward pass, shared by every batch

  @jax.jit
  def rows(pullback, js):
    def one(j):
      cotangent = jnp.zeros((length, model_config.d_model)).at[j].set(direction)
      return jnp.any(pullback(cotangent)[0][0] != 0, axis=-1)    # [length]
    return jax.vmap(one)(js)

  starts = range(0, length, batch)
  out = [np.asarray(rows(pullback, jnp.arange(s, s + batch) % length)) for s in starts]
  return np.concatenate(out)[:length]


def lra_fields(task: str, variant: str, scale: str, *,
               settings: tuple = (), seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
  """`(fields [length, length], valid [length], first)`: the state fields of
  `configs/lra.py:TASK,VARIANT,SCALE`'s encoder (with `settings`, `'model.KEY=VALUE'`) over
  one example whose content fills `valid`, `first` the position of its first content token
  (1 after [CLS]). The [CLS] is not flagged global, so the fields show what the variant's
  pattern reaches without its summary."""
  values = with_overrides(lra.get_config(f'{task},{variant},{scale}'),
                          [setting.split('=', 1) for setting in settings])
  config = ml_collections.ConfigDict(resolve_config(values))
  # The encoder reads embeddings, not tokens: any vocabulary builds it.
  model_config = encoder_model_config(config.model, 512)
  length = config.data.seq_len
  first = int(config.data.cls_token)
  content = (config.data.pathfinder.resolution ** 2 if task == 'pathfinder'
             else length - first)
  valid = np.arange(length) < first + content
  fields = state_fields(model_config, valid, np.zeros(length, bool), seed=seed)
  return fields, valid, first

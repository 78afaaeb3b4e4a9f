"""Creating the train state directly in its shardings.

`jax.eval_shape` of the initialiser gives the logically boxed abstract state;
the config's rules turn the boxes into `NamedSharding`s; the initialiser is
then jitted with those out-shardings, so no array ever exists unsharded.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from longformer_jax.attention.context import MODEL_STATE
from longformer_jax.models.decoder_lm import DecoderLM, state_logical_axes
from longformer_jax.models.resolved_model import ResolvedModel
from longformer_jax.parallel import sharding
from longformer_jax.train.lm_objective import chunk_context
from longformer_jax.train.train_state import TrainState


def dummy_chunk(batch_size: int, chunk_len: int) -> dict:
  """A chunk of zeros with the shapes and dtypes of real input (for `init`)."""
  zeros = jnp.zeros((batch_size, chunk_len), jnp.int32)
  flags = jnp.zeros((batch_size, chunk_len), bool)
  return dict(inputs=zeros, targets=zeros, positions=zeros, segment_ids=zeros,
              doc_start=flags, input_mask=~flags, target_mask=~flags)


def boxed_memory(model_config: ResolvedModel, batch_size: int):
  """Initial memory, each leaf boxed with its logical axes."""
  memory = DecoderLM.init_state(model_config, batch_size)
  return sharding.box_with_logical_axes(memory, state_logical_axes(memory))


def init_variables(model: DecoderLM, rng: jax.Array, batch_size: int, chunk_len: int) -> dict:
  """Every Flax collection of `model` at initialisation: `params` (logically boxed) and,
  for models with non-gradient state, `model_state` (train/train_state.py)."""
  chunk = dummy_chunk(batch_size, chunk_len)
  memory = DecoderLM.init_state(model.config, batch_size)
  return dict(model.init({'params': rng}, chunk['inputs'], memory,
                         chunk_context(chunk, deterministic=True)))


def init_params(model: DecoderLM, rng: jax.Array, batch_size: int, chunk_len: int):
  """Logically boxed parameters of `model`."""
  return init_variables(model, rng, batch_size, chunk_len)['params']


def create_train_state(model: DecoderLM, optimizer: optax.GradientTransformation,
                       rng: jax.Array, batch_size: int, chunk_len: int) -> TrainState:
  """The boxed initial state (use inside `jax.eval_shape` / `jax.jit`)."""
  init_rng, state_rng = jax.random.split(rng)
  variables = init_variables(model, init_rng, batch_size, chunk_len)
  params = variables['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params),
                    memory=boxed_memory(model.config, batch_size), rng=state_rng,
                    model_state=variables.get(MODEL_STATE, {}))


def abstract_train_state(model: DecoderLM, optimizer: optax.GradientTransformation, seed: int,
                         batch_size: int, chunk_len: int, mesh: jax.sharding.Mesh, rules):
  """`(abstract, shardings)`: shapes, dtypes and shardings of the train state.

  `abstract` is a pytree of `jax.ShapeDtypeStruct` with `.sharding` set (what
  a checkpoint restore needs); nothing is allocated.
  """
  create = lambda key: create_train_state(model, optimizer, key, batch_size, chunk_len)
  boxed = jax.eval_shape(create, jax.random.PRNGKey(seed))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract = jax.tree_util.tree_map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      nn.meta.unbox(boxed), shardings)
  return abstract, shardings


def sharded_train_state(model: DecoderLM, optimizer: optax.GradientTransformation, seed: int,
                        batch_size: int, chunk_len: int, mesh: jax.sharding.Mesh, rules):
  """`(state, shardings)`: the initial train state created directly on `mesh`."""
  _, shardings = abstract_train_state(model, optimizer, seed, batch_size, chunk_len, mesh, rules)
  create = lambda key: nn.meta.unbox(create_train_state(model, optimizer, key, batch_size, chunk_len))
  # Not under `activation_sharding`: DenseGeneral initialises a flat kernel
  # and would constrain it with the full-rank names. out_shardings place it.
  state = jax.jit(create, out_shardings=shardings)(jax.random.PRNGKey(seed))
  return state, shardings


def train_state_with_params(model: DecoderLM, optimizer: optax.GradientTransformation,
                            seed: int, batch_size: int, chunk_len: int,
                            mesh: jax.sharding.Mesh, rules, params, abstract=None):
  """`(state, shardings)`: the initial train state of `sharded_train_state` with `params`
  (e.g. imported; unboxed, the model's shapes) in place of the initialised ones.

  The model is only traced for shapes (`jax.eval_shape`), never initialised: one
  compiled call builds the optimizer state, memory and rng on `mesh`. A model with
  non-gradient state (`model_state`) takes the full initialisation instead.
  `abstract`: `abstract_train_state`'s result, if the caller already has it.
  `params`' buffers are donated to the state (deleted after the call): with
  `place_consuming` before it, the parameters exist once in host memory, not three
  times (numpy, placed, state).
  """
  abstract, shardings = abstract or abstract_train_state(model, optimizer, seed, batch_size,
                                                         chunk_len, mesh, rules)
  if jax.tree_util.tree_leaves(abstract.model_state):
    state, shardings = sharded_train_state(model, optimizer, seed, batch_size, chunk_len,
                                           mesh, rules)
    params = jax.device_put(params, shardings.params)
    return state.replace(params=params, opt_state=optimizer.init(params)), shardings

  def build(key, params):
    _, state_rng = jax.random.split(key)       # as create_train_state splits it
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params),
                      memory=nn.meta.unbox(boxed_memory(model.config, batch_size)),
                      rng=state_rng, model_state={})
  state = jax.jit(build, out_shardings=shardings, donate_argnums=1)(
      jax.random.PRNGKey(seed), params)
  return state, shardings


def place_consuming(params: dict, shardings) -> dict:
  """`params` (nested dicts of numpy arrays) placed with `shardings` (the same tree), leaf
  by leaf, emptying `params` as it goes: each numpy leaf is freed once placed, so host
  memory holds one extra leaf at a time, not a second copy of the model."""
  placed = {}
  for key in list(params):
    value = params.pop(key)
    placed[key] = (place_consuming(value, shardings[key]) if isinstance(value, dict)
                   else jax.device_put(value, shardings[key]))
    del value
  return placed


def memory_shardings(model_config, batch_size: int, mesh: jax.sharding.Mesh, rules):
  """Shardings of a fresh memory for `batch_size` rows."""
  abstract = jax.eval_shape(lambda: boxed_memory(model_config, batch_size))
  return sharding.logical_shardings(abstract, mesh, rules)

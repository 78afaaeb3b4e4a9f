"""The call contract, run over every registered block and layer stack (docs/design.md,
contracts 1 and 4, and "Model-level hooks").

Every entry of `models/block_registry.BLOCK_TYPES` (a block is
`Block(config, dtype)(x, state, ctx) -> (x, (state, aux))`) and of
`models/stack_registry.STACK_TYPES` (a stack is `Stack(config, dtype)(x, states,
ctx) -> (x, states, aux_per_layer)` with a static `init_state`) is built from a
tiny config with Transformer-XL attention (`TINY` holds the few settings an
entry needs) and run for two chunks under `jax.lax.scan` by one jitted function
(the helpers of test_contract_attention.py). Checked, as for the attention
variants:

- states keep the structure, shapes and dtypes of `init_state` over chunks;
- a row flagged `reset` gives the same outputs whatever its memory held
  (for a stack that delays its output, those of the new document's positions),
  as does a document starting inside a chunk, and rows do not influence each
  other;
- aux values are float32 scalars (one dict per layer for stacks); gradients
  with respect to the parameters and the input are finite;
- bfloat16 inputs give finite bfloat16 outputs.

Remat (`model.remat_policy`, parallel/remat.py): for every stack that accepts
a policy (the others refuse it with a ConfigError naming the key), each policy
must be applied: its `checkpoint` equations carry that policy, and the
residuals saved for the backward pass shrink in the expected order
(full < dots_no_batch < dots < everything <= none), so a policy that is not
applied fails.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from longformer_jax.attention.registry import attention_state
from longformer_jax.config.errors import ConfigError
from longformer_jax.models.attendre_delay import total_delay
from longformer_jax.models.block_registry import BLOCK_TYPES
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.stack_registry import STACK_TYPES
from longformer_jax.parallel.remat import REMAT_POLICIES
from tests.support import contract_checks as contract
from tests.support.remat_equations import remat_policies_in
from tests.support.tiny_models import tiny_model_config

B = contract.B
REGISTRIES = {'block': BLOCK_TYPES, 'stack': STACK_TYPES}

# Per-entry settings that make a tiny instance valid (the time-shifted stack
# exists for Attendre's delayed queries: 2 layers x 2 delayed queries).
TINY = {
    ('stack', 'attendre_delay'): dict(attention='attendre',
                                      attendre={'memory_size': 12, 'q_memory_size': 2}),
    ('stack', 'universal_act'): dict(universal_act={'max_steps': 2}),
}

ENTRIES = [pytest.param(kind, name, id=f'{kind}:{name}')
           for kind, registry in REGISTRIES.items() for name in sorted(registry)]


def tiny_entry_config(kind: str, name: str, **overrides):
  return tiny_model_config(**{kind: name}, **TINY.get((kind, name), {}), **overrides)


def entry_module(kind: str, name: str, config, dtype):
  """`(module, init_state(dtype), adapt)` of a registry entry; adapt -> (y, state, aux)."""
  if kind == 'block':
    module = BLOCK_TYPES[name](config, dtype, name='block')
    attention = layer_config(config, 0)
    init = lambda d: attention_state(attention, B, d)
    return module, init, lambda out: (out[0], out[1][0], out[1][1])
  cls = STACK_TYPES[name]
  return cls(config, dtype, name='blocks'), (lambda d: cls.init_state(config, B, d)), None


@functools.lru_cache(maxsize=None)
def harness(kind: str, name: str) -> dict:
  config = tiny_entry_config(kind, name)
  _, init, adapt = entry_module(kind, name, config, jnp.float32)
  h = contract.build_harness(lambda dtype: entry_module(kind, name, config, dtype)[0], init,
                             adapt or (lambda out: out))
  h['delay'] = total_delay(config)
  return h


def test_every_registered_entry_builds():
  for kind, name in TINY:
    assert name in REGISTRIES[kind], f'TINY names an unregistered {kind} {name!r}'
  for kind, registry in REGISTRIES.items():
    for name in sorted(registry):
      config = tiny_entry_config(kind, name)   # a ConfigError here: add the entry to TINY
      module, init, _ = entry_module(kind, name, config, jnp.float32)
      jax.eval_shape(lambda: init(jnp.float32))
      if kind == 'stack':
        assert callable(getattr(STACK_TYPES[name], 'init_state', None)), f'{name}: no init_state'


@pytest.mark.parametrize('kind,name', ENTRIES)
def test_state_keeps_init_state_shapes_under_scan(kind, name):
  contract.check_state_shapes(harness(kind, name), f'{kind}:{name}')


@pytest.mark.parametrize('kind,name', ENTRIES)
def test_reset_row_ignores_memory_and_rows_are_independent(kind, name):
  h = harness(kind, name)
  contract.check_reset_and_rows(h, f'{kind}:{name}', delay=h['delay'])


@pytest.mark.parametrize('kind,name', ENTRIES)
def test_document_starting_inside_a_chunk_ignores_the_previous_one(kind, name):
  h = harness(kind, name)
  contract.check_document_inside_chunk(h, f'{kind}:{name}', delay=h['delay'])


@pytest.mark.parametrize('kind,name', ENTRIES)
def test_aux_and_gradients_are_finite(kind, name):
  contract.check_gradients(harness(kind, name), f'{kind}:{name}')


@pytest.mark.parametrize('kind,name', ENTRIES)
def test_bfloat16_inputs_give_finite_outputs(kind, name):
  contract.check_bfloat16(harness(kind, name), f'{kind}:{name}')


# --------------------------------------------------------------------- remat


def remat_footprint(kind: str, name: str, policy: str, scan_layers: bool):
  """(checkpoint policies in the forward jaxpr, bytes saved for the backward pass), or
  None when the entry refuses the policy (a ConfigError naming model.remat_policy)."""
  try:
    config = tiny_entry_config(kind, name, remat_policy=policy, scan_layers=scan_layers)
  except ConfigError as error:
    assert 'remat_policy' in str(error) or 'scan_layers' in str(error), error
    return None
  module, init, _ = entry_module(kind, name, config, jnp.float32)
  x = contract.random_inputs(0)[0]
  ctx = jax.tree_util.tree_map(lambda a: a[0], contract.context(contract.stream_positions(0)))
  state = init(jnp.float32)
  params = nn.meta.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(0), x, state, ctx))
  forward = lambda p, x: jnp.sum(module.apply(p, x, state, ctx)[0])
  residuals = jax.eval_shape(lambda p, x: jax.vjp(forward, p, x)[1], params, x)
  saved = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(residuals))
  return remat_policies_in(jax.make_jaxpr(forward)(params, x).jaxpr), saved


@pytest.mark.parametrize('name', [pytest.param(n, id=f'stack:{n}') for n in sorted(STACK_TYPES)])
def test_remat_policy_changes_what_is_saved_for_backward(name):
  for scan_layers in (False, True):
    footprints = {policy: remat_footprint('stack', name, policy, scan_layers)
                  for policy in REMAT_POLICIES}
    accepted = {policy: f for policy, f in footprints.items() if f is not None}
    if set(accepted) <= {'none'}:
      continue                                  # the stack refuses remat (and says so)
    assert set(accepted) == set(REMAT_POLICIES), f'{name}: accepts only {sorted(accepted)}'
    for policy, (found, _) in accepted.items():
      if policy == 'none':
        assert not found, f'stack:{name}: remat without a policy'
      else:
        assert found and all(f is REMAT_POLICIES[policy] for f in found), \
            f'stack:{name} (scan_layers={scan_layers}): policy {policy!r} not applied: {found}'
    saved = {policy: f[1] for policy, f in accepted.items()}
    order = ['full', 'dots_no_batch', 'dots', 'everything']
    assert all(saved[a] < saved[b] for a, b in zip(order, order[1:])), (name, saved)
    assert saved['everything'] <= saved['none'], (name, saved)

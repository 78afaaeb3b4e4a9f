"""The call contract, run over every registered attention variant (docs/design.md, contract 1).

Every entry of `attention/registry.ATTENTION_VARIANTS` is built from a tiny
config (`tiny_model_config`, with the few settings of `TINY` that make a small
instance valid and reach its memory) and run for two chunks under
`jax.lax.scan` (contract 4) by one jitted function per variant that returns
the outputs, the final state, the aux values and the gradients. Checked:

- the state returned has exactly the structure, shapes and dtypes of
  `init_state`, after several chunks, from several starting memories;
- a row flagged `reset` gives the same outputs whatever the memory held before
  (a warm memory, another stream's memory, an empty one), on the reset chunk
  and the next one; a row without reset does depend on its memory (so the
  check can fail);
- rows do not influence each other: another input and memory in row 1 leave
  row 0's outputs unchanged;
- a document that starts inside a chunk (a new segment id, no reset) gives
  the same outputs whatever the memory and the earlier tokens of the chunk;
- `aux` is a dict of float32 scalars; gradients with respect to the
  parameters and the input are finite, and reach the input;
- bfloat16 inputs, state and compute give finite bfloat16 outputs and keep
  the state's dtypes;
- a fully masked row (`valid` all False, memory cleared by `reset`) gives
  exactly zero, with finite gradients.

A new variant is covered by registering it; `test_every_registered_variant_builds`
fails if it cannot be built from a tiny config (add its settings to `TINY`).
The stack and block registries are checked in tests/models/test_contract_stacks.py, the
eviction policies in tests/memory/test_contract_policies.py. The harness and the checks
are in tests/support/contract_checks.py, shared with test_contract_stacks.py.
"""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.registry import ATTENTION_VARIANTS, attention_layer, section_of
from longformer_jax.attention.shared_settings import SharedSettings
from tests.support.contract_checks import (B, C, K, TINY, VARIANTS, assert_finite, check_bfloat16,
                                           check_document_inside_chunk, check_gradients,
                                           check_reset_and_rows, check_state_shapes, harness,
                                           random_inputs, reset_context, row, tiny_attention_config)


# ------------------------------------------------------------------- tests


def test_every_registered_variant_builds():
  unknown = set(TINY) - set(ATTENTION_VARIANTS)
  assert not unknown, f'TINY names unregistered variants {unknown}'
  for name, cls in sorted(ATTENTION_VARIANTS.items()):
    assert callable(getattr(cls, 'init_state', None)), f'attention:{name} has no init_state'
    config = tiny_attention_config(name)      # a ConfigError here: add the variant to TINY
    assert isinstance(attention_layer(config, jnp.float32, name='attention'), cls), name
    jax.eval_shape(lambda: cls.init_state(section_of(cls, config), SharedSettings.of(config), B,
                                          jnp.float32))


# The fields a variant's module may have: its section, the shared settings, its dtype (and
# flax's own parent and name). Any other field re-declares a setting (attention/shared_settings.py).
MODULE_FIELDS = {'config', 'shared', 'dtype', 'parent', 'name',
                 'layer_index'}   # BigBird: the layer's number in its stack, not a setting


def test_a_variant_holds_its_section_and_the_shared_settings_only():
  for name, cls in sorted(ATTENTION_VARIANTS.items()):
    fields = {field.name for field in dataclasses.fields(cls)}
    assert fields <= MODULE_FIELDS, f'attention:{name} re-declares {sorted(fields - MODULE_FIELDS)}'
    assert 'shared' in fields, f'attention:{name} has no shared settings'
    section = getattr(cls, 'Config', None)
    if section is not None:
      assert cls.__dataclass_fields__['config'].type in (section, section.__name__), name
    assert not hasattr(cls, 'from_config'), f'attention:{name} still copies settings (from_config)'
    built = attention_layer(tiny_attention_config(name), jnp.float32, name='attention')
    if section is not None:
      want = section.build(getattr(tiny_attention_config(name), name).to_dict(), f'model.{name}')
      assert built.config == want, f'attention:{name} does not hold its section as configured'


def test_init_state_takes_the_section_and_the_shared_settings():
  # A variant's empty memory comes from what its module holds, not from the whole model
  # config (docs/design.md, contract 1): `init_state(config, shared, batch_size, dtype)`,
  # `config` its section (None for a variant without one), `shared` the SharedSettings.
  for name, cls in sorted(ATTENTION_VARIANTS.items()):
    parameters = inspect.signature(cls.init_state).parameters
    assert list(parameters) == ['config', 'shared', 'batch_size', 'dtype'], \
        f'attention:{name}.init_state{inspect.signature(cls.init_state)}'
    section = getattr(cls, 'Config', None)
    got = parameters['config'].annotation
    assert got is section, f'attention:{name}.init_state: config is {got!r}, not {section!r}'
    assert parameters['shared'].annotation is SharedSettings, f'attention:{name}.init_state'


@pytest.mark.parametrize('name', VARIANTS)
def test_state_keeps_init_state_shapes_under_scan(name):
  check_state_shapes(harness(name), name)


@pytest.mark.parametrize('name', VARIANTS)
def test_reset_row_ignores_memory_and_rows_are_independent(name):
  check_reset_and_rows(harness(name), name)


@pytest.mark.parametrize('name', VARIANTS)
def test_document_starting_inside_a_chunk_ignores_the_previous_one(name):
  check_document_inside_chunk(harness(name), name)


@pytest.mark.parametrize('name', VARIANTS)
def test_aux_and_gradients_are_finite(name):
  check_gradients(harness(name), name)


@pytest.mark.parametrize('name', VARIANTS)
def test_fully_masked_row_gives_zeros(name):
  h = harness(name)
  valid = np.ones((K, B, C), bool)
  valid[:, 0] = False                          # row 0: padding only, memory cleared by reset
  (ys, _, _), grads = h['run'](h['params'], h['warm'], random_inputs(3), reset_context(valid))
  np.testing.assert_array_equal(row(ys, 0), 0.0, err_msg=f'{name}: padded row is not zero')
  assert np.abs(row(ys, 1)).sum() > 0
  assert_finite(grads, f'{name}: gradients with a fully masked row')


@pytest.mark.parametrize('name', VARIANTS)
def test_bfloat16_inputs_give_finite_outputs(name):
  check_bfloat16(harness(name), name)

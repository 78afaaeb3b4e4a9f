"""The next-token loss of Attendre's time-shifted stack (a Q memory in training).

Reference: with a K/V memory holding the whole step and the causal mask, a
delayed stack computes the standard causal stack's outputs D slots late. So
its loss, with the drain and the targets moved D slots, equals that of
vanilla causal attention reading the step whole in one chunk, with the same
parameters (the stacks name them alike). So do its gradients when the
memories pass them back within the step (`attendre.memory_gradients`); with
stop-gradient memories, a layer whose queries wait a chunk or more gets none
into its query, key and value projections.

Under `causal=False` with `hide_predicted` (the Q memory's look-ahead in
training), every input that is a target is hidden from the queries before it.
With every token a target that is the causal mask, so the loss and gradients
again equal vanilla causal attention; with targets on part of the step, a
query's output depends on the later inputs it may see and not on the predicted
ones (the layer's float64 reference: tests/attention/test_attendre.py).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.train.delayed_targets import drained_batch
from longformer_jax.train.initialization import init_params
from longformer_jax.models.attendre_delay import total_delay
from longformer_jax.train.lm_objective import chunk_context, lm_sums
from tests.support.tiny_models import stream_batch, tiny_model_config

CHUNK, LENGTH = 8, 24


def delayed_config(causal=True, q_memory_size=(5, 4), memory_gradients=True,
                   hide_predicted=False):
  """Two Attendre layers with Q memories of 5 and 4: D = 9, drained by two chunks of 8."""
  schedule = {'attendre': {'q_memory_size': ','.join(map(str, q_memory_size))}}
  return tiny_model_config(attention='attendre', stack='attendre_delay', causal=causal,
                           scan_layers=False, layer_schedule=schedule,
                           attendre={'memory_size': 64, 'memory_gradients': memory_gradients,
                                     'hide_predicted': hide_predicted})


@functools.lru_cache(maxsize=None)
def loss_and_grads_fn(config, chunk_len):
  model = DecoderLM(config)

  def mean_loss(params, batch):
    memory = DecoderLM.init_state(config, batch['inputs'].shape[0])
    _, sums = lm_sums(model, params, memory, batch, chunk_len)
    return sums['loss_sum'] / sums['tokens'], sums['tokens']
  return jax.jit(jax.value_and_grad(mean_loss, has_aux=True))


def answer_only(batch):
  """Targets only in each row's last 6 slots: the end of the step, inside the delay."""
  mask = np.zeros_like(batch['target_mask'])
  mask[:, -6:] = True
  return dict(batch, target_mask=mask)


@pytest.mark.parametrize('targets,causal', [('every_token', True), ('end_of_step_only', True),
                                            ('every_token', False)])
def test_delayed_stack_loss_and_grads_equal_the_causal_stack(targets, causal):
  # causal=False: every input is a target, so hiding the predicted ones is the causal mask.
  config = delayed_config(causal=causal, hide_predicted=not causal)
  params = nn.meta.unbox(init_params(DecoderLM(config), jax.random.PRNGKey(0), 2, CHUNK))
  batch = stream_batch(2, LENGTH, seed=4, doc_len=11)
  if targets == 'end_of_step_only':
    batch = answer_only(batch)
  (loss, tokens), grads = loss_and_grads_fn(config, CHUNK)(params, batch)
  reference = tiny_model_config(attention='vanilla')
  (ref_loss, ref_tokens), ref_grads = loss_and_grads_fn(reference, LENGTH)(params, batch)
  assert float(tokens) == float(ref_tokens) == float(np.sum(batch['target_mask']))
  np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
                         grads, ref_grads)


def test_stop_gradient_memories_leave_a_long_delay_layer_no_attention_gradient():
  # Layer 0's queries wait 8 = C slots, so each is answered from memory alone: with
  # stop-gradient memories its query, key and value projections get no gradient.
  config = delayed_config(q_memory_size=(CHUNK, 1), memory_gradients=False)
  params = nn.meta.unbox(init_params(DecoderLM(config), jax.random.PRNGKey(0), 2, CHUNK))
  (loss, _), grads = loss_and_grads_fn(config, CHUNK)(params, stream_batch(2, LENGTH, seed=4))
  assert np.isfinite(float(loss))
  attention = grads['blocks']['layer_0']['attention']
  for name in ('query', 'key', 'value'):
    assert float(np.abs(attention[name]['kernel']).max()) == 0.0, name
  assert float(np.abs(attention['out']['kernel']).max()) > 0


def test_drain_rounds_up_to_whole_chunks_and_moves_only_targets():
  batch = stream_batch(2, LENGTH, seed=1)
  drained = drained_batch(batch, 11, CHUNK)
  assert drained['inputs'].shape == (2, LENGTH + 16)
  np.testing.assert_array_equal(drained['inputs'][:, :LENGTH], batch['inputs'])
  np.testing.assert_array_equal(drained['targets'][:, 11:11 + LENGTH], batch['targets'])
  assert not np.asarray(drained['target_mask'])[:, :11].any()
  assert not np.asarray(drained['target_mask'])[:, 11 + LENGTH:].any()
  assert not np.asarray(drained['input_mask'])[:, LENGTH:].any()
  np.testing.assert_array_equal(drained['positions'][:, LENGTH:],
                                np.arange(LENGTH, LENGTH + 16)[None].repeat(2, 0))


def test_predicted_inputs_are_the_target_mask_one_slot_on():
  batch = answer_only(stream_batch(2, LENGTH, seed=1))
  drained = drained_batch(batch, 11, CHUNK, flag_predicted=True)
  expected = np.zeros((2, LENGTH + 16), bool)
  expected[:, LENGTH - 5:LENGTH] = True          # the inputs that slots -6 .. -2 predict
  np.testing.assert_array_equal(drained['predicted'], expected)
  assert 'predicted' not in drained_batch(batch, 11, CHUNK)


@functools.lru_cache(maxsize=None)
def delayed_logits_fn(config):
  """`(params, batch) -> [rows, T, vocab]` logits of each input's position: the step and its
  drain read chunk by chunk, the predicted inputs flagged."""
  model, delay = DecoderLM(config), total_delay(config)

  def logits(params, batch):
    drained = drained_batch(batch, delay, CHUNK, flag_predicted=True)
    memory, outputs = DecoderLM.init_state(config, batch['inputs'].shape[0]), []
    for start in range(0, drained['inputs'].shape[1], CHUNK):
      chunk = {k: v[:, start:start + CHUNK] for k, v in drained.items()}
      out, memory, _ = model.apply({'params': params}, chunk['inputs'], memory,
                                   chunk_context(chunk, deterministic=True))
      outputs.append(out)
    return jnp.concatenate(outputs, axis=1)[:, delay:delay + batch['inputs'].shape[1]]
  return jax.jit(logits)


def test_look_ahead_reads_later_prompt_inputs_but_never_a_predicted_one():
  config = delayed_config(causal=False, hide_predicted=True)
  params = nn.meta.unbox(init_params(DecoderLM(config), jax.random.PRNGKey(0), 2, CHUNK))
  batch = answer_only(stream_batch(2, LENGTH, seed=4))     # inputs 19-23 are predicted
  logits = delayed_logits_fn(config)
  base = np.asarray(logits(params, batch))
  for slot, seen in ((LENGTH - 3, False), (LENGTH - 6, True)):
    inputs = np.asarray(batch['inputs']).copy()
    inputs[:, slot] = (inputs[:, slot] + 1) % 256
    moved = np.abs(np.asarray(logits(params, dict(batch, inputs=inputs))) - base).max(-1)
    # The positions before the slot read it (a prompt input) or not at all (a predicted one).
    if seen:
      assert moved[:, :slot].max() > 1e-3
    else:
      np.testing.assert_array_equal(moved[:, :slot], 0.0)
    assert moved[:, slot:].max() > 1e-3           # the later positions read it causally


def test_delayed_queries_that_see_later_keys_are_refused_by_the_loss():
  config = delayed_config(causal=False)
  params = nn.meta.unbox(init_params(DecoderLM(config), jax.random.PRNGKey(0), 2, CHUNK))
  with pytest.raises(ConfigError, match='model.causal'):
    loss_and_grads_fn(config, CHUNK)(params, stream_batch(2, LENGTH, seed=4))

"""Greedy decoding of the LED decoder and ROUGE of the decoded sequences against the references.

The decoder is causal: its logits at position t depend on the decoder inputs
up to t only. Decoding starts from `[BOS, PAD, ...]` and fills input t + 1
with the argmax at position t, `target_len - 1` times; one more pass gives
the predictions of every position. A prediction ends at its first EOS; the
reference is the target up to its EOS. Both are decoded to text and scored
with ROUGE over words (`evaluation/rouge.py`).
"""

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.evaluation.rouge import mean_rouge, words
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import decoder_context


def greedy_decode(model, params, batch: dict, bos_id: int, pad_id: int) -> jax.Array:
  """Greedy predictions `[batch, target_len]` int32 of an `EncoderDecoder` for `batch`.

  Args:
    model: the `EncoderDecoder`.
    params: its parameters.
    batch: `inputs`, `input_mask`, `global_flags` `[batch, seq_len]` and
      `decoder_inputs` `[batch, target_len]` (only its shape is read).
    bos_id: the first decoder input.
    pad_id: the decoder inputs not decoded yet (causality hides them).
  """
  source_ctx = encoder_context(batch['input_mask'], batch['global_flags'], True)
  rows, length = batch['decoder_inputs'].shape
  target_ctx = decoder_context(jnp.ones((rows, length), bool), True)

  def predictions(decoder_inputs):
    logits, _ = model.apply({'params': params}, batch['inputs'], source_ctx, decoder_inputs,
                            target_ctx)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def fill_next(t, decoder_inputs):
    return decoder_inputs.at[:, t + 1].set(predictions(decoder_inputs)[:, t])

  start = jnp.full((rows, length), pad_id, jnp.int32).at[:, 0].set(bos_id)
  return predictions(jax.lax.fori_loop(0, length - 1, fill_next, start))


def until_eos(ids: np.ndarray, eos_id: int) -> np.ndarray:
  """`ids` before the first `eos_id` (all of them without one)."""
  ends = np.flatnonzero(ids == eos_id)
  return ids[:ends[0]] if ends.size else ids


def rouge_of_batches(model, params, batches, tokenizer) -> dict:
  """Mean ROUGE-1/2/L F-measures (over words) of greedy decoding on every real example.

  Args:
    model: the `EncoderDecoder`.
    params: its parameters.
    batches: evaluation batches (with `weight`, 0 on padding rows, and
      `decoder_targets`), for example `TaskEvaluator.batches()`.
    tokenizer: the run's tokenizer (`decode`, `bos_id`, `eos_id`, `pad_id`).
  """
  decode = jax.jit(lambda p, b: greedy_decode(model, p, b, tokenizer.bos_id, tokenizer.pad_id))
  pairs = []
  for batch in batches:
    predicted = np.asarray(jax.device_get(decode(params, batch)))
    targets = np.asarray(jax.device_get(batch['decoder_targets']))
    weights = np.asarray(jax.device_get(batch['weight']))
    for row in np.flatnonzero(weights > 0):
      prediction = tokenizer.decode(until_eos(predicted[row], tokenizer.eos_id))
      reference = tokenizer.decode(until_eos(targets[row], tokenizer.eos_id))
      pairs.append((words(prediction), words(reference)))
  return mean_rouge(pairs)

"""Reading passkey grid documents chunk by chunk while capturing what the layers compute.

The diagnostics of learnt memories (benchmarks/passkey_expiry.py: Expire-Span's spans;
benchmarks/compressive_reconstruction.py: the compressed slots) read the grid's documents
as the passkey grid scores them (`evaluation/passkey_scoring.document_batch`: one row per
document from BOS, teacher-forced, the memory carried from chunk to chunk and nothing
else), capture per chunk some of the layers' intermediates, and look at the memory as the
answer's chunk starts. This module does that reading once for both.
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.evaluation.passkey_scoring import document_batch
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.train.lm_objective import chunk_context


@dataclasses.dataclass(frozen=True)
class Reading:
  """arrays: `document_batch`'s `[rows, width]` arrays; per_layer: what `per_chunk` returned
  for every chunk, concatenated along the length (`[rows, width, ...]` per layer);
  memory_at_answer: the model's memory as the chunk that holds the answer starts (the last
  such chunk over the rows); answers_in_one_chunk: whether every row's answer starts in it."""
  arrays: dict
  per_layer: list
  memory_at_answer: object
  answers_in_one_chunk: bool


def capturing_step(model_config, capture: Callable):
  """The jitted chunk step `(params, memory, chunk) -> (memory, intermediates)` of
  `DecoderLM(model_config)`, capturing what Flax's `capture_intermediates` filter `capture`
  `(module, method_name) -> bool` selects. Build it once and read every grid cell with it."""
  model = DecoderLM(model_config)

  @jax.jit
  def step(params, memory, chunk):
    (_, memory, _), sown = model.apply(
        {'params': params}, chunk['inputs'], memory, chunk_context(chunk, deterministic=True),
        mutable=['intermediates'], capture_intermediates=capture)
    return memory, sown['intermediates']
  return step


def read_documents(step, model_config, params, documents: list, chunk_len: int, tokenizer, *,
                   per_chunk: Callable) -> Reading:
  """Reads `documents` (one row each) in chunks of `chunk_len` with `step` (`capturing_step`
  of `model_config`).

  Args:
    per_chunk: the sown intermediates of one chunk -> a list of `[rows, chunk, ...]` numpy
      arrays, one per layer.
  """
  arrays = document_batch(documents, len(documents), chunk_len, tokenizer.bos_id,
                          tokenizer.pad_id)
  memory = DecoderLM.init_state(model_config, len(documents))
  answer_chunks = {(d.answer_start + 1) // chunk_len for d in documents}  # BOS shifts inputs
  per_layer, held = None, None
  for index, begin in enumerate(range(0, arrays['inputs'].shape[1], chunk_len)):
    if index == max(answer_chunks):
      held = memory
    chunk = {k: jnp.asarray(v[:, begin:begin + chunk_len]) for k, v in arrays.items()}
    memory, sown = step(params, memory, chunk)
    layers = per_chunk(sown)
    per_layer = layers if per_layer is None else [np.concatenate([a, b], 1)
                                                  for a, b in zip(per_layer, layers)]
  return Reading(arrays=arrays, per_layer=per_layer, memory_at_answer=held,
                 answers_in_one_chunk=len(answer_chunks) == 1)

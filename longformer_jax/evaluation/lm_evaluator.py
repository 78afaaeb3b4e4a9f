"""Held-out evaluation: streams of whole documents, memory carried across chunks.

Used by train.py (periodic validation) and eval.py (a table over memory
lengths). Rows are finite streams of documents (`EvalStreams`); every
target token of the split is scored exactly once; the memory of each
row persists from chunk to chunk and is reset at document starts.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.data.far_recurrences import FarRecurrenceMarker
from longformer_jax.data.eval_streams import EvalStreams
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import ResolvedModel
from longformer_jax.parallel import sharding
from longformer_jax.train import initialization, steps
from longformer_jax.train.profiling import StepProfiler

LN2 = math.log(2.0)
TOKENS_PER_CALL = 512  # an eval call scans max(1, this // chunk_len) chunks (dispatch amortisation)


def summarize(loss_sum: float, tokens: float, num_bytes: float) -> dict:
  """Loss (nats/token), bits per token and per byte, perplexity."""
  loss = loss_sum / max(tokens, 1.0)
  return {
      'loss': loss,
      'bits_per_token': loss / LN2,
      'bits_per_byte': loss_sum / LN2 / max(num_bytes, 1.0),
      'perplexity': math.exp(min(loss, 700.0)),
      'tokens': tokens,
      'bytes': num_bytes,
  }


def summarize_far(totals: dict, min_distance: int) -> dict:
  """The `far_*` metrics of the far-recurrence subset (data/far_recurrences.py)."""
  far = summarize(totals['subset/loss_sum'], totals['subset/tokens'], totals['subset/bytes'])
  return {'far_distance': min_distance, 'far_bits_per_byte': far['bits_per_byte'],
          'far_bits_per_token': far['bits_per_token'], 'far_tokens': far['tokens'],
          'far_bytes': far['bytes']}


class Evaluator:
  """Compiles the eval step once for a model config and evaluation shape."""

  def __init__(self, model_config: ResolvedModel, tokenizer, *,
               batch_size: int, chunk_len: int,
               mesh: jax.sharding.Mesh, rules, param_shardings, far_distance: int = 0):
    """`far_distance > 0` also scores the far recurrences alone (`summarize_far`)."""
    self.model_config = model_config
    self.tokenizer = tokenizer
    self.batch_size = batch_size
    self.chunk_len = chunk_len
    self.chunks_per_batch = max(1, TOKENS_PER_CALL // chunk_len)
    self.far_distance = far_distance
    self.mesh = mesh
    self.rules = rules
    self._batch_sharding = sharding.batch_sharding(mesh, rules)
    self._memory_shardings = initialization.memory_shardings(model_config, batch_size, mesh, rules)
    token_bytes = jnp.asarray(tokenizer.token_byte_lengths(), jnp.float32)
    padding = model_config.vocab_size - token_bytes.shape[0]
    token_bytes = jnp.pad(token_bytes, (0, padding))
    fn = functools.partial(steps.eval_step, model=DecoderLM(model_config), chunk_len=chunk_len,
                    token_bytes=token_bytes)
    self._step = jax.jit(
        fn, in_shardings=(param_shardings, self._memory_shardings, self._batch_sharding,
                          sharding.replicated(mesh)),
        out_shardings=(self._memory_shardings, sharding.replicated(mesh)),
        donate_argnums=1)
    self._fresh_memory = jax.jit(lambda: DecoderLM.init_state(model_config, batch_size),
                                 out_shardings=self._memory_shardings)

  def fresh_memory(self):
    """Empty memory for every row, laid out on the mesh."""
    return self._fresh_memory()

  def streams(self, documents, max_tokens: int = 0) -> EvalStreams:
    return EvalStreams(documents, self.batch_size, self.chunk_len, self.tokenizer.bos_id,
                       self.tokenizer.pad_id, process_index=jax.process_index(),
                       process_count=jax.process_count(),
                       chunks_per_batch=self.chunks_per_batch, max_tokens=max_tokens)

  def evaluate(self, params, documents, max_tokens: int = 0, model_state=None,
               profiler=None) -> dict:
    """Scores `documents` (token arrays); `max_tokens > 0` stops early. `model_state`: the
    run's non-gradient model state (`TrainState.model_state`), if the model has any;
    `profiler`: a `StepProfiler` (train/profiling.py) that traces its batches."""
    memory = self.fresh_memory()
    profiler = profiler or StepProfiler.disabled()
    totals = None
    streams = self.streams(documents, max_tokens)
    marker = (FarRecurrenceMarker(len(streams.rows), self.far_distance)
              if self.far_distance > 0 else None)
    with sharding.activation_sharding(self.mesh, self.rules):
      for number, batch in enumerate(streams, start=1):
        arrays = steps.step_arrays(batch, self.tokenizer.pad_id)
        if marker is not None:
          arrays['subset_mask'] = marker.mark(batch)
        arrays = sharding.to_global_batch(arrays, self._batch_sharding)
        profiler.before(number)
        with profiler.annotation(number):
          memory, sums = self._step(params, memory, arrays, model_state or {})
        totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
        profiler.after(number, totals)
    totals = jax.tree_util.tree_map(lambda x: float(np.asarray(x)), totals)
    metrics = summarize(totals['loss_sum'], totals['tokens'], totals['bytes'])
    if marker is not None:
      metrics.update(summarize_far(totals, self.far_distance))
    return metrics

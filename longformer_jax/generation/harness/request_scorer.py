"""Token sequences scored chunk by chunk through the model's memory, many side by side.

Each sequence is one document, `[BOS] + tokens`, read from position 0 as eval.py
reads a document (evaluation/lm_evaluator.py): consecutive chunks of `chunk_len`
tokens through the chunk driver (models/chunk_driver.py), every layer's memory
carried from chunk to chunk and reset at the BOS, each token predicted from all
before it (within the chunk and through the memory). The last `num_scored` tokens
of a sequence are scored: the sum of their log-probabilities (the softmax over the
model's whole padded vocabulary, eval.py's) and whether each is the greedy choice
(the argmax over the ids generate.py may choose: no padding).

Batching: sequences longest first, `batch_size` rows a batch (the last one padded
with empty rows), each row padded with invalid positions up to the batch's longest;
a batch is read `chunks_per_call` chunks per call (a power of two, at most
`TOKENS_PER_CALL // chunk_len`, so short batches are not padded to 512 tokens), the
memory carried from call to call. Rows are independent: a row's scores do not
depend on the rows beside it or on its padding.

`fit_chunk`: a model of vanilla causal attention that keeps no memory (an import read
within its context) gives a row the same outputs in any chunk that holds the whole
row, since a query sees exactly the valid keys before it wherever the padding ends;
such a batch is read in one chunk of the power of two (at least 64) that holds its
longest row, at most `chunk_len`, instead of a whole chunk (a 20-token request in a
model of 2,048 tokens' context reads 64 positions, not 2,048).
"""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from longformer_jax.attention.context import MODEL_STATE
from longformer_jax.evaluation.lm_evaluator import TOKENS_PER_CALL
from longformer_jax.models.chunk_driver import scan_chunks
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import ResolvedModel
from longformer_jax.train.lm_objective import chunk_context


@dataclasses.dataclass
class ScoringCounts:
  """What the scorer read: `tokens` (valid input positions), `positions` (padding
  included) and `seconds` (the calls, compilation included)."""
  tokens: int = 0
  positions: int = 0
  seconds: float = 0.0


SHORTEST_FITTED_CHUNK = 64


def fitted_chunk(inputs_len: int, chunk_len: int) -> int:
  """The power of two (at least `SHORTEST_FITTED_CHUNK`) that holds `inputs_len` positions,
  at most `chunk_len`."""
  width = SHORTEST_FITTED_CHUNK
  while width < inputs_len:
    width *= 2
  return min(width, chunk_len)


def chunks_per_call(num_chunks: int, chunk_len: int) -> int:
  """The chunks one call reads for a batch of `num_chunks` chunks: the power of two that
  covers them, at most `TOKENS_PER_CALL // chunk_len` (at least 1)."""
  most = max(1, TOKENS_PER_CALL // chunk_len)
  if num_chunks >= most:
    return most
  power = 1
  while power < num_chunks:
    power *= 2
  return min(power, most)


class RequestScorer:
  """Scores token sequences (module doc); compiles one program per chunks-per-call size."""

  def __init__(self, model_config: ResolvedModel, params, model_state, *, chunk_len: int,
               batch_size: int, pad_id: int, allowed: np.ndarray, fit_chunk: bool = False):
    """Args:
      model_config: the scoring model (`vocab_size` padded, `lm_model_config`).
      params, model_state: the run's parameters and non-gradient model state.
      chunk_len: C, tokens per chunk.
      batch_size: rows read side by side.
      pad_id: the token of padded input positions.
      allowed: bool `[vocab_size]`, the ids a greedy choice ranges over.
      fit_chunk: read a batch in a chunk fitted to its longest row (module doc; only for
        vanilla causal attention without memory).
    """
    self.model = DecoderLM(model_config)
    self.params = params
    self.model_state = model_state or {}
    self.chunk_len = int(chunk_len)
    self.batch_size = int(batch_size)
    self.pad_id = int(pad_id)
    self.allowed = jnp.asarray(allowed)
    self.fit_chunk = fit_chunk
    self.counts = ScoringCounts()
    self._call = jax.jit(self._score_chunks, donate_argnums=2, static_argnums=4)
    self._fresh_memory = jax.jit(functools.partial(DecoderLM.init_state, model_config,
                                                   self.batch_size))

  def _score_chunks(self, params, model_state, memory, batch: dict, chunk_len: int):
    """`batch`: `[rows, n * chunk_len]` arrays (inputs, targets, positions, segment_ids, doc_start,
    input_mask, score_mask) -> (memory after them, float32 `[rows]` sums of the scored
    targets' log-probabilities, int32 `[rows]` scored targets that are not the greedy
    choice)."""
    variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}

    def one_chunk(memory, chunk, index):
      del index
      logits, memory, _ = self.model.apply(variables, chunk['inputs'], memory,
                                           chunk_context(chunk, deterministic=True))
      logits = logits.astype(jnp.float32)
      log_probs = -optax.softmax_cross_entropy_with_integer_labels(logits, chunk['targets'])
      greedy = jnp.argmax(jnp.where(self.allowed, logits, -jnp.inf), axis=-1) == chunk['targets']
      scored = chunk['score_mask']
      return memory, (jnp.sum(jnp.where(scored, log_probs, 0.0), axis=-1),
                      jnp.sum(scored & ~greedy, axis=-1, dtype=jnp.int32))

    memory, (log_probs, missed) = scan_chunks(one_chunk, memory, batch, chunk_len)
    return memory, jnp.sum(log_probs, axis=0), jnp.sum(missed, axis=0)

  def score(self, sequences: list, num_scored: list) -> list[tuple[float, bool]]:
    """`(log-probability, greedy)` of the last `num_scored[i]` tokens of `sequences[i]`
    (int `[n_i]`, BOS first) given the tokens before them, in the order given."""
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    results = [None] * len(sequences)
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      scores = self._score_batch([np.asarray(sequences[i]) for i in rows],
                                 [int(num_scored[i]) for i in rows])
      for row, score in zip(rows, scores):
        results[row] = score
    return results

  def _score_batch(self, sequences: list, num_scored: list) -> list[tuple[float, bool]]:
    inputs_len = max(len(sequence) - 1 for sequence in sequences)
    if inputs_len <= 0:
      return [(0.0, True)] * len(sequences)
    c = fitted_chunk(inputs_len, self.chunk_len) if self.fit_chunk else self.chunk_len
    num_chunks = -(-inputs_len // c)
    group = chunks_per_call(num_chunks, c)
    total = -(-num_chunks // group) * group * c
    arrays = self._batch_arrays(sequences, num_scored, total)
    started = time.perf_counter()
    memory = self._fresh_memory()
    per_call = []                      # read on the host once the batch is dispatched
    for offset in range(0, total, group * c):
      window = {name: value[:, offset:offset + group * c] for name, value in arrays.items()}
      memory, sums, misses = self._call(self.params, self.model_state, memory, window, c)
      per_call.append((sums, misses))
    fetched = jax.device_get(per_call)      # one transfer for the batch, not one per call
    log_probs = np.sum([np.asarray(sums, np.float64) for sums, _ in fetched], axis=0)
    missed = np.sum([misses for _, misses in fetched], axis=0)
    self.counts.seconds += time.perf_counter() - started
    self.counts.tokens += int(arrays['input_mask'].sum())
    self.counts.positions += int(arrays['input_mask'].size)
    return [(float(log_probs[row]), bool(missed[row] == 0)) for row in range(len(sequences))]

  def _batch_arrays(self, sequences: list, num_scored: list, total: int) -> dict:
    """The `[batch_size, total]` arrays of a batch (rows past `len(sequences)` empty)."""
    shape = (self.batch_size, total)
    inputs = np.full(shape, self.pad_id, np.int32)
    targets = np.zeros(shape, np.int32)
    input_mask = np.zeros(shape, bool)
    score_mask = np.zeros(shape, bool)
    for row, (sequence, scored) in enumerate(zip(sequences, num_scored)):
      length = len(sequence) - 1
      if not 0 <= scored <= length:
        raise ValueError(f'{scored} scored tokens in a sequence of {len(sequence)} (BOS first)')
      inputs[row, :length] = sequence[:-1]
      targets[row, :length] = sequence[1:]
      input_mask[row, :length] = True
      score_mask[row, length - scored:length] = True
    positions = np.broadcast_to(np.arange(total, dtype=np.int32), shape)
    return {'inputs': inputs, 'targets': targets, 'positions': positions,
            'segment_ids': np.zeros(shape, np.int32), 'doc_start': positions == 0,
            'input_mask': input_mask, 'score_mask': score_mask}

"""Exact memory-carrying decoding of a causal `DecoderLM`, one chunk window at a time.

The model is run exactly as the chunk driver runs it over a long document
(`models/chunk_driver.py`, docs/design.md contract 4): consecutive chunks of
`chunk_len` tokens, every layer's state carried from one chunk to the next.

- The prompt's full chunks go through `scan_chunks`, `chunks_per_call` at a
  time (then one by one), committing the state each chunk leaves.
- The last, partial chunk and every generated token: the layer states stay
  as they were at the start of the current chunk; the chunk's tokens so far
  are re-run, padded to `chunk_len` with invalid positions (`valid=False`,
  positions continuing), so one jitted step of fixed shape serves every
  token; the next-token logits are read at the last valid position. When
  the chunk fills up, the state that full chunk produced is committed and a
  new chunk starts.

Exactness: the committed states are those of the full chunks of the
sequence, as in the chunked forward over the whole sequence; within the
current chunk the output at a valid position t then equals the full
forward's whenever outputs at t do not depend on the tokens after t in the
chunk (their content or their validity). That holds for every causal
variant whose masks and memory reads depend only on positions <= t
(docs/design.md, contract 2); `generation_checks.py` refuses the others.

Cost: every token runs one chunk forward (`chunk_len` positions), so
generating n tokens costs about n * chunk_len positions of work, and memory
stays constant however long the prompt or the output. Vanilla models can
decode one token per step with a key/value cache instead (`kv_cache.py`: this
decoder with chunks of one token over a FIFO K/V memory).

One stream (batch 1). Positions start at 0 with the BOS that opens the
document (the first chunk resets every memory); segment ids are 0.
"""

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.models.chunk_driver import scan_chunks
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import ResolvedModel

CHUNKS_PER_CALL_TOKENS = 512   # the prompt scans max(1, this // chunk_len) chunks per call


@dataclasses.dataclass
class DecodingState:
  """Where decoding stands (host bookkeeping around device arrays).

  Attributes:
    memory: every layer's state at the start of the current chunk (the
      model's memory tuple, leaves `[1, ...]`).
    chunk_tokens: int32 `[chunk_len]` numpy: the current chunk's tokens,
      `pad_id` after the first `filled`.
    filled: tokens in the current chunk (0 <= filled < chunk_len).
    chunk_start: absolute position of the current chunk's first token.
    logits: float32 `[vocab]` next-token logits after the last token.
  """
  memory: Any
  chunk_tokens: np.ndarray
  filled: int
  chunk_start: int
  logits: jax.Array

  @property
  def length(self) -> int:
    """Tokens read so far (BOS included)."""
    return self.chunk_start + self.filled


def chunk_context(positions: jax.Array, num_valid) -> AttentionContext:
  """The context of one `[1, chunk_len]` chunk of the stream whose first `num_valid`
  slots are real (the rest padding); the chunk at position 0 resets the memory."""
  chunk_len = positions.shape[1]
  return AttentionContext(
      positions=positions,
      segment_ids=jnp.zeros_like(positions),
      reset=positions[:, 0] == 0,
      valid=(jnp.arange(chunk_len) < num_valid)[None, :],
      deterministic=True)


class ChunkWindowDecoder:
  """Compiles the chunk step once for a model and chunk length; see the module doc."""

  def __init__(self, model_config: ResolvedModel, params, *,
               chunk_len: int, pad_id: int, model_state: Optional[dict] = None,
               chunks_per_call: int = 0, compiler_options: Optional[dict] = None):
    """Args:
      model_config: the model config with `vocab_size` set (`lm_model_config`).
      params: the model's parameters.
      chunk_len: C, the chunk length the model was trained with.
      pad_id: the token that fills the unused slots of the current chunk.
      model_state: the run's non-gradient model state (`TrainState.model_state`).
      chunks_per_call: full prompt chunks per scan call (0: 512 tokens' worth; 1: no
        scan, the prompt's chunks go through the chunk step one by one).
      compiler_options: XLA options of the decoder's two programs (None: the defaults).
    """
    self.model_config = model_config
    self.model = DecoderLM(model_config)
    self.params = params
    self.model_state = model_state or {}
    self.chunk_len = int(chunk_len)
    self.pad_id = int(pad_id)
    self.chunks_per_call = chunks_per_call or max(1, CHUNKS_PER_CALL_TOKENS // self.chunk_len)
    self._step = jax.jit(self._chunk_step, compiler_options=compiler_options)
    self._scan = jax.jit(self._scan_full_chunks, compiler_options=compiler_options)

  def _apply(self, params, model_state, memory, tokens, ctx):
    variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}
    logits, memory, _ = self.model.apply(variables, tokens, memory, ctx)
    return logits, memory

  def _chunk_step(self, params, model_state, memory, tokens, num_valid, chunk_start):
    """`tokens [1, C]` of which `num_valid >= 1` are real -> (float32 logits `[vocab]` at
    the last real one, the state the chunk leaves)."""
    positions = (chunk_start + jnp.arange(self.chunk_len, dtype=jnp.int32))[None, :]
    logits, memory = self._apply(params, model_state, memory, tokens,
                                 chunk_context(positions, num_valid))
    last = jax.lax.dynamic_index_in_dim(logits[0], num_valid - 1, axis=0, keepdims=False)
    return last.astype(jnp.float32), memory

  def _scan_full_chunks(self, params, model_state, memory, tokens, first_position):
    """`tokens [1, n * C]` of full chunks through the chunk driver -> (logits `[vocab]`
    after the last token, the state the last chunk leaves)."""
    positions = (first_position + jnp.arange(tokens.shape[1], dtype=jnp.int32))[None, :]

    def one_chunk(memory, chunk, index):
      del index
      logits, memory = self._apply(params, model_state, memory, chunk['tokens'],
                                   chunk_context(chunk['positions'], self.chunk_len))
      return memory, logits[0, -1].astype(jnp.float32)

    memory, last_logits = scan_chunks(one_chunk, memory,
                                      {'tokens': tokens, 'positions': positions}, self.chunk_len)
    return last_logits[-1], memory

  def fresh_memory(self):
    """Empty memory of one stream."""
    return DecoderLM.init_state(self.model_config, 1)

  def start(self, token_ids) -> DecodingState:
    """Reads a document's first tokens (BOS first, at least one) and returns the state
    whose `logits` predict the next token."""
    token_ids = np.asarray(token_ids, np.int32).reshape(-1)
    if token_ids.size == 0:
      raise ValueError('start() needs at least one token (the BOS)')
    c = self.chunk_len
    memory, position, logits = self.fresh_memory(), 0, None
    full = token_ids.size // c
    group = self.chunks_per_call * c
    while self.chunks_per_call > 1 and full * c - position >= group:
      logits, memory = self._scan(self.params, self.model_state, memory,
                                  jnp.asarray(token_ids[None, position:position + group]),
                                  jnp.int32(position))
      position += group
    while position < full * c:
      logits, memory = self._step(self.params, self.model_state, memory,
                                  jnp.asarray(token_ids[None, position:position + c]),
                                  jnp.int32(c), jnp.int32(position))
      position += c
    chunk_tokens = np.full([c], self.pad_id, np.int32)
    rest = token_ids[position:]
    if rest.size:                      # the partial chunk: one step over its tokens
      chunk_tokens[:rest.size] = rest
      logits, _ = self._step(self.params, self.model_state, memory,
                             jnp.asarray(chunk_tokens[None, :]), jnp.int32(rest.size),
                             jnp.int32(position))
    return DecodingState(memory=memory, chunk_tokens=chunk_tokens, filled=int(rest.size),
                         chunk_start=position, logits=logits)

  def append(self, state: DecodingState, token: int) -> DecodingState:
    """Reads one more token; returns the new state (the old one is left unchanged)."""
    return self._read(dataclasses.replace(state, chunk_tokens=state.chunk_tokens.copy()),
                      int(token))

  def _read(self, state: DecodingState, token: int) -> DecodingState:
    state.chunk_tokens[state.filled] = token
    filled = state.filled + 1
    logits, memory = self._step(self.params, self.model_state, state.memory,
                                jnp.asarray(state.chunk_tokens[None, :]), jnp.int32(filled),
                                jnp.int32(state.chunk_start))
    if filled < self.chunk_len:
      return dataclasses.replace(state, filled=filled, logits=logits)
    return DecodingState(memory=memory, chunk_tokens=np.full([self.chunk_len], self.pad_id,
                                                             np.int32),
                         filled=0, chunk_start=state.chunk_start + self.chunk_len, logits=logits)

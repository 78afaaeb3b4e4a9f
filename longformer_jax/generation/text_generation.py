"""The generation loop: prompt text in, sampled continuation out, printed as it comes.

`generate_text` reads `[BOS] + encode(prompt)` (or a prompt of token ids as given) with the chunk-window decoder,
then repeats: choose the next token from the logits (`sampling.py`, step i
with `step_key(seed, i)`), hand it to `StreamingText` (whose printable text
goes to `write` at once), read it. It ends after `max_new_tokens` tokens, at
a stop string, or when the model ends the document (BOS or EOS, which are
not printed). Padding and the ids that only pad the vocabulary are never
chosen.
"""

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.generation.chunk_window_decoder import ChunkWindowDecoder
from longformer_jax.generation.sampling import SamplingSettings, sample_token, step_key
from longformer_jax.generation.streaming_text import StreamingText

STOP_STRING = 'stop_string'
END_OF_DOCUMENT = 'end_of_document'
MAX_NEW_TOKENS = 'max_new_tokens'


@dataclasses.dataclass
class GenerationResult:
  """What one call generated: `text` (as printed), `token_ids` (every chosen token,
  the one ending the document included) and why it ended (`STOP_STRING`,
  `END_OF_DOCUMENT` or `MAX_NEW_TOKENS`)."""
  text: str
  token_ids: list
  finish_reason: str


def allowed_tokens(tokenizer, padded_vocab_size: int) -> np.ndarray:
  """bool `[padded_vocab_size]`: the tokenizer's ids except padding."""
  allowed = np.arange(padded_vocab_size) < tokenizer.vocab_size
  allowed[tokenizer.pad_id] = False
  return allowed


def end_tokens(tokenizer) -> set:
  """The ids that end a document: BOS (the next document's start) and EOS, if any."""
  return {i for i in (tokenizer.bos_id, tokenizer.eos_id) if i is not None and i >= 0}


def make_chooser(allowed: np.ndarray, settings: SamplingSettings) -> Callable:
  """Jitted `(logits [vocab], seed, step) -> int32 token` over the allowed ids."""
  allowed = jnp.asarray(allowed)

  def choose(logits, seed, step):
    logits = jnp.where(allowed, logits, -jnp.inf)
    return sample_token(logits, step_key(seed, step), settings)
  return jax.jit(choose)


def generate_text(decoder: ChunkWindowDecoder, tokenizer, prompt: str | Sequence[int], *,
                  settings: SamplingSettings, max_new_tokens: int, seed: int = 0,
                  stops: Sequence[str] = (), write: Callable[[str], None] = lambda s: None
                  ) -> GenerationResult:
  """Generates a continuation of `prompt` (module doc); `write` gets each printable piece."""
  choose = make_chooser(allowed_tokens(tokenizer, decoder.model_config.vocab_size), settings)
  ends = end_tokens(tokenizer)
  text = StreamingText(tokenizer, stops)
  if isinstance(prompt, str):
    prompt_ids = np.concatenate([[tokenizer.bos_id], tokenizer.encode(prompt)]).astype(np.int32)
  else:                                # token ids, read as given
    prompt_ids = np.asarray(prompt, np.int32).reshape(-1)
  state = decoder.start(prompt_ids)
  chosen, reason = [], MAX_NEW_TOKENS
  for step in range(max_new_tokens):
    token = int(choose(state.logits, seed, step))
    chosen.append(token)
    if token in ends:
      reason = END_OF_DOCUMENT
      break
    piece = text.push(token)
    if piece:
      write(piece)
    if text.stopped:
      reason = STOP_STRING
      break
    if step + 1 < max_new_tokens:
      state = decoder.append(state, token)
  tail = text.finish()
  if tail:
    write(tail)
  return GenerationResult(text=text.text, token_ids=chosen, finish_reason=reason)

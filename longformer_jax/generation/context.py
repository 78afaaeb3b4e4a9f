"""Decoding an imported checkpoint exactly within its context, and what happens beyond it.

An imported decoder's workdir holds `hf_import.json` (convert/workdir_cli.py):
its `context_len` is the checkpoint's context, `max_position_embeddings`
(GPT-2: `n_positions`). Without `--kv_cache`, generate.py then decodes so
that every text up to `context_len` tokens (BOS included) gets exactly the
original model's logits:

  * all layers vanilla with rotary positions (Llama, Mistral and Qwen2
    without a binding window): a key/value cache of `context_len` tokens
    (generation/kv_cache.py), one token per step; past the context it keeps
    the last `context_len` tokens (a sliding window). With the RoPE scalings
    dynamic and longrope it is exact up to their original context; past it the
    cached keys come from hidden states computed at shorter lengths (close to,
    not equal to the original: docs/import.md, "RoPE scalings");
  * otherwise (GPT-2's learned positions, Mistral's and Qwen2's windowed
    layers): the chunk-window decoder with chunks of `context_len` tokens;
    past the context the run's configured memory takes over (`model.mem_len`
    and the attention's own state; none for a plain import: each chunk of
    `context_len` tokens starts afresh; a rolling window carries on).

When the text first passes the context, one line on stderr says which.
"""

import json
import os
import sys
from typing import Callable, Optional

import ml_collections

from longformer_jax.config.errors import UserError
from longformer_jax.generation.kv_cache import kv_cache_refusal
from longformer_jax.storage import paths

IMPORT_FILE = 'hf_import.json'


def read_import(workdir: str) -> Optional[dict]:
  """The workdir's `hf_import.json` (None for a run train.py started from scratch)."""
  path = os.path.join(workdir, IMPORT_FILE)
  if not paths.as_path(path).exists():
    return None
  try:
    info = json.loads(paths.as_path(path).read_text())
  except json.JSONDecodeError as error:
    raise UserError(f'--workdir: {path} is not valid JSON ({error})') from None
  if not isinstance(info, dict) or not isinstance(info.get('context_len'), int):
    raise UserError(f'--workdir: {path} has no integer context_len')
  return info


def exact_decoding(model: ml_collections.ConfigDict, context_len: int) -> tuple:
  """`(kv_cache, chunk_len, notice)`: generate.py's default for an imported model (module
  doc); `notice` is the line printed when the text passes `context_len`."""
  passed = f'generate.py: the text passed the checkpoint\'s context ({context_len} tokens); '
  if not kv_cache_refusal(model):
    return context_len, 1, (passed + f'from here the key/value cache keeps the last '
                            f'{context_len} tokens (a sliding window)')
  return 0, context_len, (passed + 'from here the configured memory takes over ('
                          + configured_memory(model, context_len) + ')')


def configured_memory(model: ml_collections.ConfigDict, context_len: int) -> str:
  """What carries from one `context_len`-token chunk to the next, in words."""
  schedule = dict(model.layer_schedule).get('attention', '')
  kinds = sorted(set(schedule.split(','))) if schedule else [model.attention]
  mem_len = model.mem_len
  parts = []
  for kind in kinds:
    if kind == 'vanilla':
      parts.append(f'vanilla layers: model.mem_len={mem_len}' + (
          '' if mem_len else f', no cache, each {context_len}-token chunk starts afresh'))
    elif kind == 'streaming_sinks':
      sinks = model.streaming_sinks
      parts.append(f'streaming_sinks layers: their rolling window of {sinks.window} '
                   f'tokens ({sinks.num_sinks} sinks) carries on')
    else:
      parts.append(f'{kind} layers: their own memory (model.mem_len={mem_len})')
  return '; '.join(parts)


class NoticeAtContext:
  """A decoder (`start`, `append`, `model_config`) that calls `write(notice)` once, when the
  text read first passes `context_len` tokens."""

  def __init__(self, decoder, context_len: int, notice: str,
               write: Callable[[str], None] = lambda line: print(line, file=sys.stderr)):
    self.decoder = decoder
    self.model_config = decoder.model_config
    self.context_len = context_len
    self.notice = notice
    self.write = write
    self.noticed = False

  def _check(self, state):
    if not self.noticed and state.length > self.context_len:
      self.noticed = True
      self.write(self.notice)
    return state

  def start(self, token_ids):
    return self._check(self.decoder.start(token_ids))

  def append(self, state, token: int):
    return self._check(self.decoder.append(state, token))

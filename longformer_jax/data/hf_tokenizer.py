"""A Hugging Face `tokenizer.json` (the `tokenizers` package) behind the project's interface.

For checkpoints imported with `longformer_jax.convert.hf` (docs/import.md):
`data.tokenizer='hf'`, `data.tokenizer_file=PATH/tokenizer.json`. A
SentencePiece `.model` file (Llama 1/2, Mistral) goes through
`data.tokenizer='sentencepiece'` instead.

Special ids are looked up by the usual token names (`BOS_NAMES`, ...).
GPT-2's and Qwen2's `<|endoftext|>` serves as BOS (and EOS), as in their
training. Without a padding token, `pad_id` is the EOS id, else BOS (padded
positions are masked). A tokenizer without BOS (T5's: `<pad>`, `</s>`,
`<unk>`) has `has_bos = False` and `bos_id = pad_id`, T5's decoder start
token; `make_tokenizer` refuses it for the tasks that start every document
or example with BOS (all but seq2seq). `encode` adds no special tokens;
`decode` drops them.
"""

import functools
import json
from typing import Iterable

import numpy as np
import tokenizers

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths

KEY = 'data.tokenizer_file'
BOS_NAMES = ('<s>', '<|begin_of_text|>', '<|endoftext|>', '<bos>')
EOS_NAMES = ('</s>', '<|end_of_text|>', '<|endoftext|>', '<eos>', '<|im_end|>')
PAD_NAMES = ('<pad>', '<|finetune_right_pad_id|>', '[PAD]')


class HfTokenizer:
  """A `tokenizers.Tokenizer` with the interface of `ByteTokenizer`."""

  def __init__(self, path: str):
    """Loads `path`; raises `ConfigError` naming it when missing or unreadable."""
    self.path = str(path)
    try:
      # From its text: the same for a local file and a gs:// object.
      self._tokenizer = tokenizers.Tokenizer.from_str(paths.as_path(self.path).read_text())
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(KEY, f'{self.path!r} is not a readable tokenizer.json '
                        f'({str(e).splitlines()[0] if str(e) else type(e).__name__})') from None
    self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
    self.bos_id = self._first_id(BOS_NAMES)
    self.eos_id = self._first_id(EOS_NAMES)
    pad = self._first_id(PAD_NAMES)
    self.pad_id = pad if pad >= 0 else (self.eos_id if self.eos_id >= 0 else self.bos_id)
    if self.pad_id < 0:
      raise ConfigError(KEY, f'{self.path!r} has no beginning-of-text (one of {BOS_NAMES}), '
                        f'padding (one of {PAD_NAMES}) or end-of-text token (one of '
                        f'{EOS_NAMES}) to start or pad a sequence with')
    self.has_bos = self.bos_id >= 0
    if not self.has_bos:  # T5: the decoder starts with the pad token
      self.bos_id = self.pad_id

  def missing_bos(self) -> tuple[str, str]:
    """`(config key, what is missing)` for the error of a task that needs BOS."""
    return KEY, f'{self.path!r} has no beginning-of-text token (one of {BOS_NAMES})'

  @classmethod
  def load(cls, path: str) -> 'HfTokenizer':
    return cls(path)

  def _first_id(self, names) -> int:
    for name in names:
      token_id = self._tokenizer.token_to_id(name)
      if token_id is not None:
        return int(token_id)
    return -1

  def encode(self, data: bytes | str) -> np.ndarray:
    """int32 `[n]` ids of `data`, no special tokens added."""
    text = data.decode('utf-8') if isinstance(data, bytes) else data
    return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """The text of `ids`; special and out-of-range ids are dropped."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    ids = ids[(ids >= 0) & (ids < self.vocab_size)]
    return self._tokenizer.decode(ids.tolist(), skip_special_tokens=True)

  @functools.lru_cache(maxsize=1)
  def token_byte_lengths(self) -> np.ndarray:
    """int32 `[vocab_size]`: bytes of text per token (0 for special tokens), for bits per byte.

    Exact for byte-level BPE (GPT-2, Llama 3, Qwen2: each character of a
    token's string stands for one byte); otherwise the UTF-8 length of the
    token decoded alone (approximate where a piece is part of a character).
    """
    special = {int(i) for i in self._special_ids()}
    byte_level = self._decoder_type() == 'ByteLevel'
    lengths = np.zeros(self.vocab_size, np.int32)
    for i in range(self.vocab_size):
      if i in special:
        continue
      if byte_level:
        lengths[i] = len(self._tokenizer.id_to_token(i) or '')
      else:
        lengths[i] = len(self._tokenizer.decode([i], skip_special_tokens=True).encode('utf-8'))
    return lengths

  def _decoder_type(self) -> str:
    decoder = json.loads(self._tokenizer.to_str()).get('decoder') or {}
    return decoder.get('type', '')

  def _special_ids(self) -> list:
    return [token_id for token_id, token in self._tokenizer.get_added_tokens_decoder().items()
            if token.special]

"""ListOps' fixed vocabulary (`data.tokenizer='listops'`): one id per symbol, the same on every run.

LRA built its ListOps vocabulary from a Python set at run time, so its token
ids changed from run to run; here the vocabulary is this module's tuple.
`encode` reads the text form of data/lra/listops.py (symbols separated by
spaces) and LRA's own TSV form, whose parentheses it drops.
"""

from typing import Iterable

import numpy as np

from longformer_jax.data.lra.listops import CLOSE, DIGITS, OPERATORS

SPECIALS = ('<pad>', '<cls>', '<eos>')
VOCABULARY = SPECIALS + DIGITS + OPERATORS + (CLOSE,)
_IDS = {symbol: index for index, symbol in enumerate(VOCABULARY)}
_IGNORED = frozenset({'(', ')'})


class ListOpsTokenizer:
  """Symbols <-> ids: 0 pad, 1 [CLS] (the BOS of the task pipelines), 2 EOS, digits, operators, `]`."""

  pad_id = 0
  bos_id = 1
  eos_id = 2
  vocab_size = len(VOCABULARY)

  def encode(self, data: bytes | str) -> np.ndarray:
    """The ids of the whitespace-separated symbols of `data`, int32 `[n]`; an unknown symbol
    is a `ValueError` naming it."""
    if isinstance(data, bytes):
      data = data.decode('utf-8')
    ids = []
    for symbol in data.split():
      if symbol in _IGNORED:
        continue
      if symbol not in _IDS or symbol in SPECIALS:
        raise ValueError(f'{symbol!r} is not a ListOps symbol; expected a digit, one of '
                         f'{OPERATORS} or {CLOSE!r}')
      ids.append(_IDS[symbol])
    return np.asarray(ids, np.int32)

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """The symbols of `ids`, space-separated; specials and unknown ids are dropped."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    return ' '.join(VOCABULARY[i] for i in ids if len(SPECIALS) <= i < len(VOCABULARY))

  def token_byte_lengths(self) -> np.ndarray:
    """Bytes of the text form per id (specials 0); the task scores labels, not bytes."""
    return np.array([0 if s in SPECIALS else len(s.encode('utf-8')) for s in VOCABULARY],
                    np.int32)

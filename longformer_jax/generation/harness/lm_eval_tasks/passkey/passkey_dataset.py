"""The passkey retrieval documents of data/passkey.py as an lm-eval dataset (`custom_dataset`).

Document `index` of cell (length, depth) is `data/passkey.seeded_document(seed,
length, depth, index)`, the very document `eval.passkey_grid` scores
(evaluation/passkey_grid.py): filler text with a 5-digit key hidden at the depth,
then the question. Lengths are in bytes, which are the tokens of the byte-level
passkey models (configs/passkey.py, configs/passkey_memory.py). Each row is one
loglikelihood request: `context` (the document up to the answer) and `key` (the
five digits). lm-eval moves the context's trailing space ("The pass key is ") into
the continuation, so a request scores the space and the five digits, and `acc` is 1
when greedy decoding gives all six; the grid's "retrieved" counts the digits alone
(the space always follows "is" in these documents).

Settings (lm-eval passes the task's `dataset_kwargs` and the run's `metadata`):
`length` (a variant's one length), else `passkey_lengths` (default 256, 1024,
4096); `passkey_depths` in percent (default 0, 25, 50, 75, 100);
`passkey_documents` per cell (default 4); `passkey_seed` (default 0). Lists may be
JSON lists or comma strings.
"""

import datasets

from longformer_jax.data import passkey

DEFAULT_LENGTHS = (256, 1024, 4096)
DEFAULT_DEPTHS = (0, 25, 50, 75, 100)
DEFAULT_DOCUMENTS = 4


def int_list(values) -> list[int]:
  """A JSON list, one number or a comma string -> ints."""
  if isinstance(values, str):
    values = [item for item in values.split(',') if item.strip()]
  elif isinstance(values, (int, float)):
    values = [values]
  return [int(value) for value in values]


def passkey_rows(lengths, depths, documents: int, seed: int) -> list[dict]:
  """One row per (length, depth in percent, document index): context, key and the cell."""
  rows = []
  for length in lengths:
    for depth in depths:
      for index in range(documents):
        document = passkey.seeded_document(seed, length, depth / 100, index)
        text = document.tokens.astype('uint8').tobytes().decode('utf-8')
        rows.append({'context': text[:document.answer_start], 'key': document.key,
                     'length': length, 'depth': depth, 'index': index})
  return rows


def passkey_documents(length=None, passkey_lengths=DEFAULT_LENGTHS,
                      passkey_depths=DEFAULT_DEPTHS, passkey_documents=DEFAULT_DOCUMENTS,
                      passkey_seed=0, **other_metadata) -> dict:
  """The task's test split (module doc); `other_metadata` (the task's version, ...) unread."""
  del other_metadata
  lengths = int_list(length) if length else int_list(passkey_lengths)
  rows = passkey_rows(lengths, int_list(passkey_depths), int(passkey_documents),
                      int(passkey_seed))
  return {'test': datasets.Dataset.from_list(rows)}

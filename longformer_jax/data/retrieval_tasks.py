"""Document-pair examples of task `retrieval` and their fixed-size arrays.

An example is two documents and a label (do they match). Each document is
`[CLS] + tokens` (or its tokens alone with `data.cls_token=False`), cut to
`data.seq_len` and padded, as a classification example; the pair is stacked
on a second axis, so each array is `[n, 2, seq_len]` and the model encodes the
`2n` documents in one pass of its one encoder (models/dual_encoder.py).

Sources (`data.corpus`):
  * `lra_retrieval` (built in): the Long Range Arena's Retrieval task rebuilt
    from the standard library: do the two documents cite the same module
    (data/lra/document_matching.py; splits train | valid | test).
"""

import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.classification_tasks import example_arrays, split_count
from longformer_jax.data.lra import document_matching

CORPORA = ('lra_retrieval',)
PAIR = 2


def pair_arrays(first: list[np.ndarray], second: list[np.ndarray], labels: list[int],
                seq_len: int, cls_id: int, pad_id: int, cls_token: bool = True,
                cls_global: bool = True) -> dict[str, np.ndarray]:
  """`inputs`, `input_mask`, `global_flags` `[n, 2, seq_len]` of the token lists of the first
  and second documents; `label`, `weight` `[n]`."""
  arrays = [example_arrays(tokens, seq_len, cls_id, pad_id, cls_token, cls_global)
            for tokens in (first, second)]
  stacked = {name: np.stack([arrays[0][name], arrays[1][name]], axis=1) for name in arrays[0]}
  return dict(stacked, label=np.asarray(labels, np.int32),
              weight=np.ones((len(labels),), np.float32))


def load_arrays(config: ml_collections.ConfigDict, split: str, tokenizer) -> dict[str, np.ndarray]:
  """The arrays of `split` of `config.data.corpus`, at most `data.max_examples` pairs."""
  data = config.data
  if data.corpus not in CORPORA:
    raise ConfigError('data.corpus', f'unknown retrieval corpus {data.corpus!r}; '
                      f'expected one of {CORPORA}')
  section = document_matching.RetrievalConfig.build(data.lra_retrieval, 'data.lra_retrieval')
  pairs = document_matching.retrieval_split(
      section, split, split_count(section.split_size(split), data.max_examples))
  return pair_arrays([tokenizer.encode(p.first) for p in pairs],
                     [tokenizer.encode(p.second) for p in pairs], [p.label for p in pairs],
                     data.seq_len, tokenizer.bos_id, tokenizer.pad_id, data.cls_token,
                     data.cls_global)

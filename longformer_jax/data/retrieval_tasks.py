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
from longformer_jax.data.curriculum_streams import require_steps_after
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
  return _arrays(config, _section(config), split, tokenizer)


def load_curriculum_arrays(config: ml_collections.ConfigDict, tokenizer
                           ) -> tuple[dict[str, np.ndarray], int] | None:
  """The training arrays of the length curriculum's first stage (short documents, padded to
  `data.seq_len`) and its steps, `data.lra_retrieval.curriculum_steps`; None when it is off.

  Raises:
    ConfigError: the curriculum leaves no step of `train.num_steps` for the long documents.
  """
  section = _section(config)
  if not section.curriculum_steps:
    return None
  require_steps_after('data.lra_retrieval.curriculum_steps', section.curriculum_steps,
                      config.train.num_steps, 'train.num_steps', 'the long documents')
  return (_arrays(config, document_matching.curriculum_config(section), 'train', tokenizer),
          section.curriculum_steps)


def _section(config: ml_collections.ConfigDict) -> document_matching.RetrievalConfig:
  if config.data.corpus not in CORPORA:
    raise ConfigError('data.corpus', f'unknown retrieval corpus {config.data.corpus!r}; '
                      f'expected one of {CORPORA}')
  return document_matching.RetrievalConfig.build(config.data.lra_retrieval, 'data.lra_retrieval')


def _arrays(config, section: document_matching.RetrievalConfig, split: str, tokenizer):
  data = config.data
  pairs = document_matching.retrieval_split(
      section, split, split_count(section.split_size(split), data.max_examples))
  return pair_arrays([tokenizer.encode(p.first) for p in pairs],
                     [tokenizer.encode(p.second) for p in pairs], [p.label for p in pairs],
                     data.seq_len, tokenizer.bos_id, tokenizer.pad_id, data.cls_token,
                     data.cls_global)

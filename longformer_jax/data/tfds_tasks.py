"""tensorflow-datasets sources of the encoder tasks: imdb_reviews, trivia_qa, scrolls.

Read from prepared data only (`data.tfds_data_dir`; on a machine with
network: `tfds build imdb_reviews`, `tfds build trivia_qa/rc`,
`tfds build scrolls/gov_report`, then copy the folder), like the LM corpora
of `tfds_corpus.py`, whose builder checks and readers this module shares
(a `gs://` data dir is read from a local mirror in `cache_dir`, `data.tfds_cache_dir`).

Split names: 'train' and 'valid'; imdb_reviews has no validation split, so
'valid' reads its test split.
"""


from longformer_jax.config.errors import ConfigError
from longformer_jax.data import tfds_corpus
from longformer_jax.data.task_text import QAText, excerpt_around

SPLITS = {
    'imdb_reviews': {'train': 'train', 'valid': 'test'},
    'trivia_qa': {'train': 'train', 'valid': 'validation'},
    'scrolls': {'train': 'train', 'valid': 'validation'},
}


def _examples(name: str, config_name: str, split: str, data_dir: str, cache_dir: str):
  family = name.split('/')[0]
  if split not in SPLITS[family]:
    raise ConfigError('eval.split', f'unknown split {split!r}; expected one of {sorted(SPLITS[family])}')
  full_name = f'{name}/{config_name}' if config_name else name
  builder = tfds_corpus._prepared_builder(full_name, data_dir, cache_dir)   # pylint: disable=protected-access
  return tfds_corpus._iterate_examples(builder, SPLITS[family][split])   # pylint: disable=protected-access


def _bytes(value) -> bytes:
  return value if isinstance(value, bytes) else str(value).encode('utf-8')


def imdb_reviews(split: str, data_dir: str,
                 cache_dir: str = tfds_corpus.DEFAULT_CACHE_DIR) -> list[tuple[bytes, int]]:
  """`(review, label)` pairs; label 1 = positive."""
  return [(_bytes(example['text']), int(example['label']))
          for example in _examples('imdb_reviews', '', split, data_dir, cache_dir)]


def find_answer(context: bytes, aliases: list[bytes]) -> tuple[int, int] | None:
  """Byte span of the first (earliest) occurrence of any alias, ignoring ASCII case."""
  lowered = context.lower()
  found = [(lowered.find(alias.lower()), len(alias)) for alias in aliases if alias]
  found = [(begin, length) for begin, length in found if begin >= 0]
  if not found:
    return None
  begin, length = min(found)
  return begin, begin + length


def trivia_qa_text(example: dict, context_len: int) -> QAText | None:
  """A QA text from a trivia_qa example: its first evidence (wikipedia, then web) holding an
  answer alias, cut to `context_len` bytes around it; None if no evidence holds one."""
  aliases = [_bytes(alias) for alias in example['answer']['aliases']]
  contexts = (list(example['entity_pages']['wiki_context'])
              + list(example['search_results']['search_context']))
  question = _bytes(example['question'])
  for context in map(_bytes, contexts):
    span = find_answer(context, aliases)
    if span is not None:
      text = excerpt_around(context, span[0], span[1], context_len, question)
      return QAText(question, text.before, text.answer, text.after)
  return None


def trivia_qa(split: str, data_dir: str, context_len: int, config_name: str = 'rc',
              cache_dir: str = tfds_corpus.DEFAULT_CACHE_DIR) -> list[QAText]:
  texts = (trivia_qa_text(example, context_len)
           for example in _examples('trivia_qa', config_name, split, data_dir, cache_dir))
  return [text for text in texts if text is not None]


def scrolls(split: str, data_dir: str, config_name: str = 'gov_report',
            cache_dir: str = tfds_corpus.DEFAULT_CACHE_DIR) -> list[tuple[bytes, bytes]]:
  """`(input, output)` pairs of `scrolls/<config_name>`; examples without an output are skipped."""
  pairs = [(_bytes(example['input']), _bytes(example['output']))
           for example in _examples('scrolls', config_name, split, data_dir, cache_dir)]
  return [(source, target) for source, target in pairs if source and target]

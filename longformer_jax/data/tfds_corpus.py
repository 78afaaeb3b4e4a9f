"""tensorflow-datasets corpora (pg19, tiny_shakespeare) from prepared data.

Never downloads: the dataset must already be prepared under
`config.data.tfds_data_dir` (on a machine with network, run
`tfds build NAME --data_dir=DIR`, then copy DIR). TensorFlow and tfds are
imported inside functions, so importing this module is cheap, and TensorFlow
is hidden from GPUs/TPUs so it leaves the accelerators to JAX.

Note: preparing (not reading) with tensorflow-datasets 4.9.10 on Python >= 3.9
needs the `importlib_resources` package, which tfds imports but does not
declare (tensorflow/datasets issue 11212): `pip install importlib_resources`
before `tfds build` if it fails with "No module named 'importlib_resources'".
"""

import dataclasses
import functools
import os

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.document import Document

DATA_DIR_KEY = 'data.tfds_data_dir'

# Our split names -> tfds split names.
TFDS_SPLITS = {'train': 'train', 'valid': 'validation', 'test': 'test'}


@dataclasses.dataclass(frozen=True)
class TfdsCorpusSpec:
  """Where a tfds dataset keeps its text and how to name its examples.

  Attributes:
    text_feature: the Text feature holding a whole document.
    title_feature: a string feature to name documents by ('' for none).
    id_feature: a feature to name documents by ('' for none: the index).
  """
  text_feature: str
  title_feature: str = ''
  id_feature: str = ''


CORPORA = {
    'pg19': TfdsCorpusSpec(text_feature='book_text',
                           title_feature='book_title', id_feature='book_id'),
    'tiny_shakespeare': TfdsCorpusSpec(text_feature='text'),
}


def load_documents(name: str, split: str, data_dir: str) -> list[Document]:
  """Reads every document of a prepared tfds dataset split, in stored order.

  Args:
    name: a key of `CORPORA` ('pg19' | 'tiny_shakespeare').
    split: 'train' | 'valid' | 'test'.
    data_dir: the tfds data folder the dataset was prepared in.

  Returns:
    Documents with UTF-8 bytes; names like 'pg19/train/10 Book Title' or
    'tiny_shakespeare/test/0'.

  Raises:
    ConfigError: unknown corpus or split, empty `data_dir`, or the dataset
      is not prepared under `data_dir`.
  """
  spec = _corpus_spec(name)
  tfds_split = _tfds_split(split)
  builder = _prepared_builder(name, data_dir)
  examples = _iterate_examples(builder, tfds_split)
  return [Document(name=_document_name(name, split, index, example, spec),
                   data=_as_bytes(example[spec.text_feature]))
          for index, example in enumerate(examples)]


def _corpus_spec(name: str) -> TfdsCorpusSpec:
  if name not in CORPORA:
    raise ConfigError('data.corpus', f'unknown tfds corpus {name!r}; '
                      f'expected one of {sorted(CORPORA)}')
  return CORPORA[name]


def _tfds_split(split: str) -> str:
  if split not in TFDS_SPLITS:
    raise ConfigError('eval.split', f'unknown split {split!r}; expected one '
                      f'of {sorted(TFDS_SPLITS)}')
  return TFDS_SPLITS[split]


def _how_to_prepare(name: str, data_dir: str) -> str:
  return (f'prepare it on a machine with network with `tfds build {name} '
          f'--data_dir={data_dir or "DIR"}` and copy that folder here '
          f'(runs never download)')


@functools.lru_cache(maxsize=1)
def _import_tfds():
  """Imports tfds with TensorFlow hidden from accelerators (JAX owns them)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  for device_type in ('GPU', 'TPU'):
    try:
      tf.config.set_visible_devices([], device_type)
    except (RuntimeError, ValueError):
      # No such devices in this TensorFlow build, or TensorFlow already
      # initialized its devices (someone used it before us).
      pass
  import tensorflow_datasets as tfds
  return tfds


def _prepared_builder(name: str, data_dir: str):
  """The real tfds builder of `name` reading from `data_dir`, if prepared."""
  if not data_dir:
    raise ConfigError(DATA_DIR_KEY, f'is empty but corpus {name!r} needs a '
                      f'prepared tensorflow-datasets folder; '
                      f'{_how_to_prepare(name, data_dir)}')
  if not os.path.isdir(data_dir):
    raise ConfigError(DATA_DIR_KEY, f'{data_dir!r} is not a folder; '
                      f'{_how_to_prepare(name, data_dir)}')
  tfds = _import_tfds()
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise ConfigError(
        DATA_DIR_KEY, f'dataset {name!r} version {builder.version} is not '
        f'prepared under {data_dir!r} (looked in {builder.data_dir}); '
        f'{_how_to_prepare(name, data_dir)}')
  return builder


def _iterate_examples(builder, tfds_split: str):
  """Yields the examples of a split as dicts of numpy values, in order."""
  tfds = _import_tfds()
  dataset = builder.as_dataset(split=tfds_split, shuffle_files=False)
  return tfds.as_numpy(dataset)


def _as_bytes(value) -> bytes:
  return value if isinstance(value, bytes) else str(value).encode('utf-8')


def _as_text(value) -> str:
  if isinstance(value, bytes):
    return value.decode('utf-8', errors='replace')
  return str(value)


def _document_name(corpus: str, split: str, index: int, example: dict,
                   spec: TfdsCorpusSpec) -> str:
  parts = []
  parts.append(_as_text(example[spec.id_feature]) if spec.id_feature
               else str(index))
  if spec.title_feature:
    parts.append(_as_text(example[spec.title_feature]))
  return f'{corpus}/{split}/' + ' '.join(parts)

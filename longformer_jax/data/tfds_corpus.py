"""tensorflow-datasets corpora (pg19, tiny_shakespeare) from prepared data.

Never downloads: the dataset must already be prepared under
`config.data.tfds_data_dir` (on a machine with network, run
`tfds build NAME --data_dir=DIR`, then copy DIR). A `gs://` data dir is read
from a local mirror of the one dataset's prepared folder, made in
`config.data.tfds_cache_dir` on first use (`tfds_mirror.py`). TensorFlow and
tfds are imported inside functions, so importing this module is cheap, and
TensorFlow is hidden from GPUs/TPUs so it leaves the accelerators to JAX.

Note: preparing (not reading) with tensorflow-datasets 4.9.10 on Python >= 3.9
needs the `importlib_resources` package, which tfds imports but does not
declare (tensorflow/datasets issue 11212): `pip install importlib_resources`
before `tfds build` if it fails with "No module named 'importlib_resources'".
"""

import dataclasses
import functools
import os

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import tfds_mirror
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.document import Document
from longformer_jax.storage import paths

DATA_DIR_KEY = 'data.tfds_data_dir'
# Where a gs:// data dir is mirrored when the caller names no cache: `data.tfds_cache_dir`'s default.
DEFAULT_CACHE_DIR = DataConfig.tfds_cache_dir

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


def load_documents(name: str, split: str, data_dir: str,
                   cache_dir: str = DEFAULT_CACHE_DIR) -> list[Document]:
  """Reads every document of a prepared tfds dataset split, in stored order.

  Args:
    name: a key of `CORPORA` ('pg19' | 'tiny_shakespeare').
    split: 'train' | 'valid' | 'test'.
    data_dir: the tfds data folder the dataset was prepared in (local or `gs://`).
    cache_dir: where a `gs://` data_dir's dataset is mirrored (`data.tfds_cache_dir`).

  Returns:
    Documents with UTF-8 bytes; names like 'pg19/train/10 Book Title' or
    'tiny_shakespeare/test/0'.

  Raises:
    ConfigError: unknown corpus or split, empty `data_dir`, the dataset
      is not prepared under `data_dir`, or its bucket is missing or refuses us.
  """
  spec = _corpus_spec(name)
  tfds_split = _tfds_split(split)
  builder = _prepared_builder(name, data_dir, cache_dir)
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
  # deferred: TensorFlow, seconds to import, only for tfds corpora (module docstring)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for device_type in ('GPU', 'TPU'):
    try:
      tf.config.set_visible_devices([], device_type)
    except (RuntimeError, ValueError):
      # No such devices in this TensorFlow build, or TensorFlow already
      # initialized its devices (someone used it before us).
      pass
  # deferred: tensorflow-datasets, only for tfds corpora, once TensorFlow hides the accelerators
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def _prepared_builder(name: str, data_dir: str, cache_dir: str = DEFAULT_CACHE_DIR):
  """The real tfds builder of `name` reading from `data_dir`, if prepared.

  A `gs://` data_dir is mirrored first (`_mirrored_builder`); `cache_dir` is
  read only then.
  """
  if not data_dir:
    raise ConfigError(DATA_DIR_KEY, f'is empty but corpus {name!r} needs a '
                      f'prepared tensorflow-datasets folder; '
                      f'{_how_to_prepare(name, data_dir)}')
  if paths.is_remote(data_dir):
    return _mirrored_builder(name, data_dir, cache_dir)
  if not os.path.isdir(data_dir):
    raise ConfigError(DATA_DIR_KEY, f'{data_dir!r} is not a folder; '
                      f'{_how_to_prepare(name, data_dir)}')
  tfds = _import_tfds()
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise _not_prepared(name, data_dir, builder.version, builder.data_dir)
  return builder


def _mirrored_builder(name: str, data_dir: str, cache_dir: str):
  """The builder of `name` reading a local mirror of its prepared folder in `gs://` data_dir.

  Reads `gs://.../<name>/<config>/<version>/` (the version the builder's code
  asks for) unless `cache_dir` already holds a complete copy; writes the copy.
  """
  tfds = _import_tfds()
  local_dir = tfds_mirror.local_data_dir(data_dir, cache_dir, DATA_DIR_KEY)
  builder = tfds.builder(name, data_dir=local_dir)
  # <name>/<config>/<version>, as tfds lays it out below a data dir.
  dataset_folder = os.path.relpath(builder.data_dir, local_dir).split(os.sep)
  remote_folder = os.fspath(paths.as_path(data_dir).joinpath(*dataset_folder))
  if not tfds_mirror.mirror_folder(remote_folder, builder.data_dir, DATA_DIR_KEY):
    raise _not_prepared(name, data_dir, builder.version, remote_folder)
  return tfds.builder(name, data_dir=local_dir)   # a fresh builder sees the copied files


def _not_prepared(name: str, data_dir: str, version, looked_in: str) -> ConfigError:
  return ConfigError(
      DATA_DIR_KEY, f'dataset {name!r} version {version} is not '
      f'prepared under {data_dir!r} (looked in {looked_in}); '
      f'{_how_to_prepare(name, data_dir)}')


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

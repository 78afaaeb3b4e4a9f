"""A Hugging Face checkpoint directory in a bucket, read through a local copy.

The importer's readers (safetensors' memory map, the tokenizer and config
files) take local files, so `local_hf_dir('gs://bucket/llama')` copies the
folder's top-level files (config.json, the safetensors files, the tokenizer)
into a temporary folder for the duration of the block; a local directory is
used as it is. `source_file` names a file of the original directory, for what
the run records (its tokenizer, `hf_import.json`'s `hf_dir`).
"""

import contextlib
import os
import tempfile
from typing import Iterator

import fsspec

from longformer_jax.convert.errors import ConversionError
from longformer_jax.storage import paths


@contextlib.contextmanager
def local_hf_dir(hf_dir: str, only: tuple = ()) -> Iterator[str]:
  """Yields a local directory with the files of `hf_dir` (itself when it is local);
  `only`: just these file names (e.g. `('config.json',)`), not the weights."""
  if not paths.is_remote(hf_dir):
    yield hf_dir
    return
  paths.check_bucket(hf_dir, '--hf_dir')
  filesystem, folder = fsspec.core.url_to_fs(hf_dir)
  if not filesystem.isdir(folder):
    raise ConversionError(f'{hf_dir}: not a directory (a Hugging Face model directory)')
  names = [name for name in filesystem.ls(folder, detail=False) if filesystem.isfile(name)
           and (not only or os.path.basename(name) in only)]
  with tempfile.TemporaryDirectory(prefix='hf_dir_') as local:
    for name in names:
      filesystem.get(name, os.path.join(local, os.path.basename(name)))
    yield local


def source_file(hf_dir: str, local_dir: str, local_path: str) -> str:
  """`local_path` (a file of `local_dir`, the copy of `hf_dir`) as a path of `hf_dir`."""
  if local_dir == hf_dir:
    return os.path.abspath(local_path)
  return f'{hf_dir.rstrip("/")}/{os.path.relpath(local_path, local_dir)}'

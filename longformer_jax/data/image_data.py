"""Image data of the image task (Image Transformer, Parmar et al., 2018): sources, order, arrays.

An image `[height, width, channels]` of intensities in `[0, levels)` is one
example: a sequence of `height * width * channels` positions, one per
intensity, channels innermost (the paper's "32 x 96" view of a 32 x 32 x 3
image; docs/variants.md, image_local). The order is the generation order of
the attention's layout:

  * `1d`: raster order (rows, then columns, then channels);
  * `2d`: block-raster order of the `[height, width * channels]` view with
    query blocks of `block_height x block_width` positions (blocks in raster
    order, raster order inside a block), the same order as
    `attention/image_local.to_block_raster` (data/ does not import
    attention/, docs/design.md "Layout"; tests check the two agree).

Arrays of a split (`load_arrays`): `targets [n, L]` int32, the intensities
in that order; `inputs [n, L]` int32, the targets shifted right by one
behind a start token `BOS = levels` (slot 0 holds BOS, slot i the intensity
of position i - 1), so the output at slot i predicts position i and a chunk
of one image starts at the image's first position, as the 2D pattern needs;
`weight [n]` float32 ones. The vocabulary is `levels + 1`.

Sources (`data.corpus`):
  * `digits` (built in, `assets/digits.csv.gz`): 1797 8 x 8 x 1 handwritten
    digits, 17 levels (0..16). Fixed split by index: train 0..1396 (1397),
    valid 1397..1596 (200), test 1597..1796 (200).
  * `cifar10`, `downsampled_imagenet/32x32` (tensorflow-datasets, prepared
    under `data.tfds_data_dir`): 32 x 32 x 3, 256 levels. cifar10 has no
    validation split: 'valid' and 'test' read its test split;
    downsampled_imagenet: 'valid' and 'test' read its validation split.
"""

import dataclasses
import gzip
import os

import ml_collections
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import tfds_corpus

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'assets')
DIGITS_FILE = os.path.join(ASSETS, 'digits.csv.gz')
DIGITS_SPLITS = {'train': (0, 1397), 'valid': (1397, 1597), 'test': (1597, 1797)}
TFDS_SPLITS = {
    'cifar10': {'train': 'train', 'valid': 'test', 'test': 'test'},
    'downsampled_imagenet/32x32': {'train': 'train', 'valid': 'validation',
                                   'test': 'validation'},
}
LAYOUTS = ('1d', '2d')


@dataclasses.dataclass(frozen=True)
class ImageSource:
  height: int
  width: int
  channels: int
  levels: int          # intensities 0 .. levels - 1

  @property
  def row_len(self) -> int:
    """Positions per image row: width * channels."""
    return self.width * self.channels

  @property
  def length(self) -> int:
    """Positions per image."""
    return self.height * self.row_len

  @property
  def vocab_size(self) -> int:
    """The intensity levels and the start token (BOS = levels)."""
    return self.levels + 1


SOURCES = {
    'digits': ImageSource(8, 8, 1, 17),
    'cifar10': ImageSource(32, 32, 3, 256),
    'downsampled_imagenet/32x32': ImageSource(32, 32, 3, 256),
}


def image_source(corpus: str) -> ImageSource:
  """The shape and levels of an image source; a `ConfigError` on `data.corpus` if unknown."""
  if corpus not in SOURCES:
    raise ConfigError('data.corpus', f'{corpus!r} is not an image source; task image reads one '
                      f'of {sorted(SOURCES)}')
  return SOURCES[corpus]


def load_digits(split: str) -> np.ndarray:
  """The digits of a split, uint8 `[n, 8, 8, 1]` in 0..16 (the csv's last column, the label,
  is dropped)."""
  if split not in DIGITS_SPLITS:
    raise ConfigError('eval.split', f'unknown split {split!r}; expected one of '
                      f'{sorted(DIGITS_SPLITS)}')
  with gzip.open(DIGITS_FILE, 'rt') as f:
    table = np.loadtxt(f, delimiter=',', dtype=np.int64)
  begin, end = DIGITS_SPLITS[split]
  return table[begin:end, :64].reshape(-1, 8, 8, 1).astype(np.uint8)


def load_tfds_images(name: str, split: str, data_dir: str, max_examples: int = 0,
                     cache_dir: str = tfds_corpus.DEFAULT_CACHE_DIR) -> np.ndarray:
  """The images of a prepared tfds image set, uint8 `[n, 32, 32, 3]` (the first
  `max_examples` if > 0); a `gs://` data_dir is read from a local copy in `cache_dir`."""
  splits = TFDS_SPLITS[name]
  if split not in splits:
    raise ConfigError('eval.split', f'unknown split {split!r}; expected one of {sorted(splits)}')
  # pylint: disable=protected-access
  builder = tfds_corpus._prepared_builder(name, data_dir, cache_dir)
  images = []
  for example in tfds_corpus._iterate_examples(builder, splits[split]):
    images.append(np.asarray(example['image'], np.uint8))
    if max_examples and len(images) >= max_examples:
      break
  shape = SOURCES[name]
  return np.stack(images) if images else np.zeros(
      (0, shape.height, shape.width, shape.channels), np.uint8)


def load_images(corpus: str, split: str, data_dir: str = '', max_examples: int = 0,
                cache_dir: str = tfds_corpus.DEFAULT_CACHE_DIR) -> np.ndarray:
  """uint8 `[n, height, width, channels]` of a split of `corpus` (tfds sets: prepared in
  `data_dir`, a `gs://` one read from a local copy in `cache_dir`)."""
  image_source(corpus)
  if corpus == 'digits':
    images = load_digits(split)
    return images[:max_examples] if max_examples else images
  return load_tfds_images(corpus, split, data_dir, max_examples, cache_dir)


def block_raster_order(height: int, width: int, block_height: int, block_width: int) -> np.ndarray:
  """`[height * width]` raster indices in block-raster order (blocks in raster order, raster
  order inside a block); `stream = raster[order]`."""
  rows = np.arange(height)[:, None]
  cols = np.arange(width)[None, :]
  # Sort key: (block row, block column, row in block, column in block).
  key = ((rows // block_height) * (width // block_width) + cols // block_width) * (
      block_height * block_width) + (rows % block_height) * block_width + cols % block_width
  return np.argsort(key.reshape(-1), kind='stable')


def to_stream(images: np.ndarray, layout: str = '1d', block_height: int = 1,
              block_width: int = 1) -> np.ndarray:
  """`[n, height, width, channels]` -> int32 `[n, height * width * channels]` in generation order.

  1d: raster order, channels innermost. 2d: block-raster order of the
  `[height, width * channels]` view (blocks must tile it).
  """
  n, height, width, channels = images.shape
  rows = images.reshape(n, height * width * channels).astype(np.int32)
  if layout == '1d':
    return rows
  if layout != '2d':
    raise ConfigError('model.image_local.layout', f'{layout!r} must be one of {list(LAYOUTS)}')
  row_len = width * channels
  if height % block_height or row_len % block_width:
    raise ConfigError('model.image_local.block_height', f'blocks {block_height} x {block_width} '
                      f'do not tile images of {height} x {row_len} positions')
  return rows[:, block_raster_order(height, row_len, block_height, block_width)]


def shifted_inputs(targets: np.ndarray, bos: int) -> np.ndarray:
  """Targets `[n, L]` shifted right by one behind `bos`: `inputs[:, 0] = bos`,
  `inputs[:, i] = targets[:, i - 1]`."""
  inputs = np.empty_like(targets)
  inputs[:, 0] = bos
  inputs[:, 1:] = targets[:, :-1]
  return inputs


def stream_layout(model: ml_collections.ConfigDict) -> tuple[str, int, int]:
  """`(layout, block_height, block_width)` of the generation order: '2d' and its query blocks
  when the model's attention is 2D image_local, else raster ('1d')."""
  section = model.get('image_local') if model.get('attention') == 'image_local' else None
  if section is not None and section.get('layout') == '2d':
    return '2d', int(section['block_height']), int(section['block_width'])
  return '1d', 1, 1


def load_arrays(config: ml_collections.ConfigDict, split: str, tokenizer=None) -> dict:
  """`{'inputs', 'targets': int32 [n, L], 'weight': float32 [n]}` of a split of `data.corpus`.

  The tokenizer is unused (intensities are the tokens); the argument keeps
  the signature of the other tasks' `load_arrays`.
  """
  del tokenizer
  data = config.data
  source = image_source(data.corpus)
  images = load_images(data.corpus, split, data.tfds_data_dir, data.max_examples,
                       data.tfds_cache_dir)
  targets = to_stream(images, *stream_layout(config.model))
  return {'inputs': shifted_inputs(targets, source.levels), 'targets': targets,
          'weight': np.ones(len(targets), np.float32)}

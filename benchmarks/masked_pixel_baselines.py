r"""What a masked-pixel score means on Pathfinder: the simplest rules for a hidden pixel.

  python -m benchmarks.masked_pixel_baselines --scale=mini \
      --setting=data.pathfinder.margin=0.5 --setting=data.pathfinder.path_gap=2.5

Self-pretraining (task masked_pretraining, configs/lra.py:pathfinder,VARIANT,SCALE,masked)
reports the loss and accuracy of the hidden pixels of the validation images. Every pixel is
as likely to be picked, so the rules below are scored over every pixel of the first
`--valid_examples` generated validation images (fitted on `--train_examples` training
images, the same generator and `--setting`s):

  majority       the most common pixel value (the background) everywhere: its accuracy
  unigram        the pixel values' frequencies: the cross-entropy (nats) of a model that
                 ignores the context
  left_neighbour the pixel to the left (the raster's previous token), as it is in the image:
                 the accuracy of copying it (the first column copies the background)
  neighbours     the pixel values' frequencies given which of the 4 neighbours (up, down,
                 left, right; outside the image: background) hold ink (16 contexts): the
                 cross-entropy and the accuracy of the most common value, what a model that
                 reads the 2D neighbourhood reaches with this little of it
"""

import argparse
import json
import sys

import numpy as np

from benchmarks.lra_shortcuts import pathfinder_data
from benchmarks.lra_table import parse_settings
from configs import lra
from longformer_jax.config.errors import ConfigError


def neighbour_contexts(images: np.ndarray) -> np.ndarray:
  """`int [n, side, side]` in 0..15: bit i set when neighbour i (up, down, left, right) of
  the pixel holds ink (is not 0); outside the image counts as background."""
  ink = np.pad(images > 0, ((0, 0), (1, 1), (1, 1)))
  up, down = ink[:, :-2, 1:-1], ink[:, 2:, 1:-1]
  left, right = ink[:, 1:-1, :-2], ink[:, 1:-1, 2:]
  return up * 1 + down * 2 + left * 4 + right * 8


def pixel_baselines(train_images: np.ndarray, valid_images: np.ndarray) -> dict:
  """The rules' scores (see the module docstring) of `uint8 [n, side, side]` images."""
  counts = np.bincount(train_images.reshape(-1), minlength=256).astype(np.float64)
  frequencies = (counts + 1e-6) / (counts + 1e-6).sum()      # unseen values: a tiny floor
  pixels = valid_images.reshape(-1)
  majority = int(np.argmax(counts))
  left = np.concatenate([np.full(valid_images.shape[:2] + (1,), majority, valid_images.dtype),
                         valid_images[:, :, :-1]], axis=2)
  table = np.full((16, 256), 1e-6)                             # [context, value] counts
  np.add.at(table, (neighbour_contexts(train_images).reshape(-1), train_images.reshape(-1)), 1)
  contexts = neighbour_contexts(valid_images).reshape(-1)
  conditional = table / table.sum(axis=1, keepdims=True)
  return {'majority_accuracy': float(np.mean(pixels == majority)),
          'neighbours_nats': float(-np.mean(np.log(conditional[contexts, pixels]))),
          'neighbours_accuracy': float(np.mean(np.argmax(table, axis=1)[contexts] == pixels)),
          'unigram_nats': float(-np.mean(np.log(frequencies[pixels]))),
          'left_neighbour_accuracy': float(np.mean(left == valid_images)),
          'majority_value': majority, 'valid_pixels': int(pixels.size)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini', choices=lra.SCALES)
  parser.add_argument('--train_examples', type=int, default=4000)
  parser.add_argument('--valid_examples', type=int, default=2000)
  parser.add_argument('--setting', action='append', default=[],
                      help='a data.pathfinder override KEY=VALUE (repeatable)')
  args = parser.parse_args(argv)
  try:
    settings = tuple(parse_settings(args.setting))
    train = pathfinder_data(args.scale, 'train', args.train_examples, settings).images
    valid = pathfinder_data(args.scale, 'valid', args.valid_examples, settings).images
  except (ValueError, ConfigError) as error:
    print(error, file=sys.stderr)
    return 2
  print(json.dumps(dict(pixel_baselines(train, valid), settings=' '.join(settings))))
  return 0


if __name__ == '__main__':
  sys.exit(main())

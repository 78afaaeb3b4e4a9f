r"""How far apart Pathfinder's evidence lies in the raster, against a sliding window's reach.

  python -m benchmarks.pathfinder_reach --scale=mini --windows=16,32 --layers=2 \
      --setting=data.pathfinder.dashes_per_path=2 --setting=data.pathfinder.margin=0.5 \
      --setting=data.pathfinder.path_gap=2.5
  python -m benchmarks.pathfinder_reach --scale=mini --variants=vanilla,local,bigbird ...

The encoders read an image as a raster: pixel (x, y) is token y * side + x (after [CLS]),
so two pixels a few rows apart are a few times `side` tokens apart. Under a one-sided
window w each layer widens what a token's state has read by w on each side: after layer l
a pixel token's state reads the raw pixels within l * w positions. Pathfinder's head
(`model.pooling='mean'`, as LRA's) averages the last layer's states, so each feature it
pools read one raster interval of 2 L w + 1 pixels (besides, with a global [CLS], the
[CLS] state of the layer before: a weighted sum over the pixels, the same for every
feature, not a second interval). Under `pooling='cls'` the pooled [CLS] reads the states
of layer L - 1, intervals of 2 (L - 1) w + 1. A feature can relate both markers only where
they lie within its interval, and can hold the whole drawing (both target paths and the
markers) only where all its ink does. Vanilla attention has no such limit from the first
layer on. `tests/benchmarks/test_pathfinder_reach.py` holds the interval to the encoder's
own gradients.

With `--variants`, the same shares for each named variant of `configs/lra.py`, from the
fields its own encoder's gradients show (`benchmarks/receptive_fields.py`; at
initialisation, the [CLS] not global), its encoder `--layers` deep and with the
`--setting`s of `model.` keys.

Printed as one JSON line: the markers' distance in raster positions and in pixels
(medians), the ink's raster span (median), and per window (and per variant) the share of
the test images whose markers, and whose ink, one pooled state has read, under the pooling
of `configs/lra.py:pathfinder,longformer,SCALE`. The images are the 2,000 test images of
that config's generator with the `--setting`s (`data.` keys, as benchmarks/lra_shortcuts.py
takes them).
"""

import argparse
import json
import sys

import numpy as np

from benchmarks import receptive_fields
from benchmarks.lra_shortcuts import pathfinder_data
from benchmarks.lra_table import parse_settings
from configs import lra
from longformer_jax.config.errors import ConfigError


def marker_positions(markers: np.ndarray, side: int) -> np.ndarray:
  """`int [n, 2]`: the raster positions of the marker centres `float [n, 2, 2]` ((x, y))."""
  centres = np.round(markers).astype(np.int64)
  return centres[..., 1] * side + centres[..., 0]


def raster_spread(images: np.ndarray, markers: np.ndarray) -> dict[str, np.ndarray]:
  """Per image of `uint8 [n, side, side]` with marker centres `float [n, 2, 2]` ((x, y)):
  `marker_tokens` the markers' distance in raster positions, `marker_pixels` in pixels, and
  `ink_tokens` the raster positions from the first pixel holding ink to the last."""
  tokens = marker_positions(markers, images.shape[-1])                    # [n, 2]
  ink = (images > 0).reshape(images.shape[0], -1)
  first = np.argmax(ink, axis=1)
  last = ink.shape[1] - 1 - np.argmax(ink[:, ::-1], axis=1)
  return {'marker_tokens': np.abs(tokens[:, 0] - tokens[:, 1]),
          'marker_pixels': np.linalg.norm(markers[:, 0] - markers[:, 1], axis=-1),
          'ink_tokens': np.where(ink.any(axis=1), last - first, 0)}


def pooled_reach(window: int, layers: int, pooling: str) -> int:
  """How far apart (in positions) two raw tokens may lie and still both be read by one
  pooled feature of a `layers`-layer encoder with one-sided `window`: the last layer's
  states under 'mean' pooling, the [CLS] state's inputs (layer L - 1) under 'cls'."""
  if pooling not in ('mean', 'cls'):
    raise ValueError(f'pooling {pooling!r}: expected mean or cls')
  return 2 * (layers if pooling == 'mean' else layers - 1) * window


def reach_table(spread: dict[str, np.ndarray], windows: list[int], layers: int,
                pooling: str) -> dict:
  """The medians of `raster_spread` and, per one-sided window w, the share of images whose
  markers (and whose ink) lie within one interval of `pooled_reach` + 1 positions."""
  out = {'marker_tokens_median': float(np.median(spread['marker_tokens'])),
         'marker_pixels_median': round(float(np.median(spread['marker_pixels'])), 2),
         'ink_tokens_median': float(np.median(spread['ink_tokens'])),
         'layers': layers, 'pooling': pooling, 'windows': {}}
  for w in windows:
    reach = pooled_reach(w, layers, pooling)
    out['windows'][str(w)] = {
        'interval': reach + 1,
        'markers_within': round(float(np.mean(spread['marker_tokens'] <= reach)), 4),
        'ink_within': round(float(np.mean(spread['ink_tokens'] <= reach)), 4)}
  return out


def field_shares(fields: np.ndarray, first: int, pooled: np.ndarray, images: np.ndarray,
                 markers: np.ndarray) -> dict:
  """The share of `images` (`uint8 [n, side, side]`, markers `float [n, 2, 2]`) whose
  markers, and whose ink, some pooled state has read whole: `fields [length, length]` as
  `receptive_fields.state_fields` measures them, the raster at positions `first` on,
  `pooled [length]` the states the head averages."""
  reads = fields[pooled]                                           # [pooled states, length]
  together = (reads.T.astype(np.float32) @ reads.astype(np.float32)) > 0    # [length, length]
  tokens = first + marker_positions(markers, images.shape[-1])
  ink = (images > 0).reshape(images.shape[0], -1)
  inked = [reads[:, first + np.flatnonzero(row)].all(axis=1).any() for row in ink]
  return {'markers_within': round(float(np.mean(together[tokens[:, 0], tokens[:, 1]])), 4),
          'ink_within': round(float(np.mean(inked)), 4),
          'field_median': float(np.median(reads.sum(axis=1)))}


def variant_table(variants: list[str], scale: str, images: np.ndarray, markers: np.ndarray,
                  model_settings: tuple = ()) -> dict:
  """`field_shares` per variant of `configs/lra.py:pathfinder,VARIANT,SCALE` with
  `model_settings` (`'model.KEY=VALUE'`), its fields measured at initialisation with the
  [CLS] not global (a global [CLS] reads every pixel and is read by every state, but as a
  weighted sum that is the same for all of them)."""
  out = {}
  for variant in variants:
    fields, valid, first = receptive_fields.lra_fields('pathfinder', variant, scale,
                                                       settings=model_settings)
    out[variant] = field_shares(fields, first, valid, images, markers)   # mean pooling
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini', choices=lra.SCALES)
  parser.add_argument('--windows', default='16,32', help='one-sided windows, comma-separated')
  parser.add_argument('--layers', type=int, default=2)
  parser.add_argument('--test_examples', type=int, default=2000)
  parser.add_argument('--variants', default='',
                      help='configs/lra.py variants whose fields to measure, comma-separated')
  parser.add_argument('--setting', action='append', default=[],
                      help='a data.pathfinder (images) or model (--variants) override '
                           'KEY=VALUE (repeatable)')
  args = parser.parse_args(argv)
  try:
    windows = [int(w) for w in args.windows.split(',') if w.strip()]
  except ValueError:
    windows = []
  if not windows or min(windows) < 1 or args.layers < 1:
    print(f'--windows={args.windows!r} --layers={args.layers}: expected windows >= 1, '
          'e.g. 16,32, and at least 1 layer', file=sys.stderr)
    return 2
  try:
    settings = tuple(parse_settings(args.setting))
    model_settings = tuple(s for s in settings if s.startswith('model.'))
    data_settings = tuple(s for s in settings if not s.startswith('model.'))
    test = pathfinder_data(args.scale, 'test', args.test_examples, data_settings)
  except (ValueError, ConfigError) as error:
    print(error, file=sys.stderr)
    return 2
  pooling = lra.get_config(f'pathfinder,longformer,{args.scale}')['model']['pooling']
  table = reach_table(raster_spread(test.images, test.markers), windows, args.layers, pooling)
  variants = [v.strip() for v in args.variants.split(',') if v.strip()]
  unknown = sorted(set(variants) - set(lra.variants('pathfinder', args.scale)))
  if unknown:
    print(f'--variants: unknown {unknown}; use those of configs/lra.py for pathfinder',
          file=sys.stderr)
    return 2
  if variants:
    depth = (f'model.num_layers={args.layers}',)
    try:
      table['variants'] = variant_table(variants, args.scale, test.images, test.markers,
                                        depth + model_settings)
    except (ValueError, ConfigError) as error:
      print(error, file=sys.stderr)
      return 2
  print(json.dumps(dict(table, settings=' '.join(settings))))
  return 0


if __name__ == '__main__':
  sys.exit(main())

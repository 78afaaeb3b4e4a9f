"""Heat maps of values in [0, 1] as PNG files, with no text: one coloured cell per value.

`heatmap_pixels(values)` draws `values [rows, cols]` as a grid of
`cell x cell` squares separated by `gap` black pixels, row 0 at the top and
column 0 at the left; a value's colour runs red (0) -> yellow (0.5) -> green
(1), linearly between the three (the end and middle colours of ColorBrewer's
RdYlGn), and a missing value (NaN) is grey. Below the grid, a colour bar
(`bar` pixels high, 0 at the left, 1 at the right, spanning the grid's width)
keys the colours. The axes are described where the numbers are
(evaluation/passkey_grid.py writes them into its JSON). `write_heatmap`
writes the PNG with `png_writer`.
"""

import numpy as np

from longformer_jax.evaluation.png_writer import write_png

LOW = np.array([215, 48, 39], np.float64)       # 0: red
MIDDLE = np.array([254, 224, 139], np.float64)  # 0.5: yellow
HIGH = np.array([26, 152, 80], np.float64)      # 1: green
MISSING = np.array([128, 128, 128], np.uint8)   # NaN: grey


def value_colours(values: np.ndarray) -> np.ndarray:
  """uint8 `[..., 3]` colours of `values [...]` (clipped to [0, 1]; NaN is grey)."""
  values = np.asarray(values, np.float64)
  t = np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0)[..., None]
  lower = LOW + (MIDDLE - LOW) * (2 * t)              # t in [0, 0.5]
  upper = MIDDLE + (HIGH - MIDDLE) * (2 * t - 1)      # t in [0.5, 1]
  colours = np.round(np.where(t <= 0.5, lower, upper)).astype(np.uint8)
  return np.where(np.isnan(values)[..., None], MISSING, colours)


def heatmap_pixels(values: np.ndarray, cell: int = 16, gap: int = 1, bar: int = 6) -> np.ndarray:
  """uint8 `[H, W, 3]` picture of `values [rows, cols]` (module docstring).

  Cell (r, c) covers pixel rows `gap + r * (cell + gap)` onward and columns
  `gap + c * (cell + gap)` onward, `cell` pixels each; `bar = 0` leaves out
  the colour bar.
  """
  values = np.asarray(values, np.float64)
  if values.ndim != 2 or 0 in values.shape:
    raise ValueError(f'a heat map needs values [rows, cols], got shape {values.shape}')
  rows, cols = values.shape
  height, width = gap + rows * (cell + gap), gap + cols * (cell + gap)
  bar_rows = bar + gap if bar else 0
  pixels = np.zeros((height + bar_rows, width, 3), np.uint8)
  colours = value_colours(values)
  for r in range(rows):
    for c in range(cols):
      top, left = gap + r * (cell + gap), gap + c * (cell + gap)
      pixels[top:top + cell, left:left + cell] = colours[r, c]
  if bar:
    inner = width - 2 * gap
    gradient = value_colours(np.linspace(0.0, 1.0, max(inner, 1)))
    pixels[height:height + bar, gap:gap + inner] = gradient[None, :inner]
  return pixels


def write_heatmap(path: str, values: np.ndarray, cell: int = 16, gap: int = 1,
                  bar: int = 6) -> None:
  """`heatmap_pixels(values, cell, gap, bar)` written as a PNG at `path`."""
  write_png(path, heatmap_pixels(values, cell, gap, bar))

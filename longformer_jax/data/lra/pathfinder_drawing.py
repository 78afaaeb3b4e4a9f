"""Pathfinder's raster: anti-aliased dashes and marker discs as 8-bit grey images.

Every shape is a segment with a half width (a disc is a segment of length 0). Its ink at a
point at distance d from the segment is the coverage profile clip(half_width + 1/2 - d, 0, 1)
(in pixels of the drawing: 1 inside the shape, falling to 0 half a pixel past its edge), as in
the original generator, which drew at a higher resolution and downsized (Linsley et al., 2018,
"Learning long-range spatial dependencies with horizontal gated recurrent units"). The
profile is evaluated at `SUPERSAMPLE` = 2 times the image's resolution over a small patch
around each shape only, and the patch's pixels are summed straight into their image pixels
(`np.bincount`, weight 1/4 each): the 2x2 mean pooling happens in the sum. Shapes of one layer
never overlap with the generator's parameters (paths keep a clearance wider than a stroke's
ink), so the sum is each shape's own coverage; it is clipped at 1 all the same.

A stroke thinner than one image pixel (Pathfinder-32's 0.5) is brightened by 1 / width, so a
pixel-centred stroke is full white as in the released images, whose downsizing rescaled the
brightest pixel to 255. The markers are drawn over the strokes (the brighter of the two).

Coordinates are (x, y) in image pixels: x along a row (the column), y down the rows; pixel
(row i, column j) covers [j, j + 1) x [i, i + 1), so its centre is (j + 0.5, i + 0.5).
"""

import numpy as np

SUPERSAMPLE = 2
# Patch pixels evaluated per batch of shapes (bounds the temporaries: 2M float32 each).
_PATCH_PIXELS_PER_BATCH = 1 << 18


def render(dashes: np.ndarray, markers: np.ndarray, resolution: int, stroke_width: float,
           marker_radius: float) -> np.ndarray:
  """The images, uint8 `[n, resolution, resolution]`.

  Args:
    dashes: float `[n, m, 2, 2]`, each dash's (start, end) as (x, y) in image pixels; a dash
      with a NaN coordinate is not drawn (a distractor that did not fit).
    markers: float `[n, k, 2]`, the marker discs' centres (x, y) in image pixels.
    resolution: the image side.
    stroke_width: the dashes' stroke width in image pixels.
    marker_radius: the discs' radius in image pixels.
  """
  n = dashes.shape[0]
  strokes = coverage(dashes.reshape(n, -1, 4), resolution, stroke_width / 2)
  strokes = np.minimum(strokes / min(1.0, stroke_width), 1.0)
  centres = np.concatenate([markers, markers], axis=-1)          # discs: segments of length 0
  discs = np.minimum(coverage(centres, resolution, marker_radius), 1.0)
  image = np.maximum(strokes, discs)
  return np.rint(image * 255).astype(np.uint8)


def coverage(segments: np.ndarray, resolution: int, half_width: float) -> np.ndarray:
  """Summed ink of `segments` float `[n, m, 4]` ((x0, y0, x1, y1) in image pixels, NaN: none)
  with `half_width`, per image pixel: float32 `[n, resolution, resolution]` (not clipped)."""
  n, m = segments.shape[:2]
  scale = SUPERSAMPLE
  reach = half_width * scale + 0.5                     # the ink's reach, supersampled pixels
  drawn = np.all(np.isfinite(segments), axis=-1)
  segments = np.where(drawn[..., None], segments, 0.0).astype(np.float32) * scale
  extent = np.max(np.maximum(np.abs(segments[..., 2] - segments[..., 0]),
                             np.abs(segments[..., 3] - segments[..., 1])), initial=0.0)
  side = int(np.ceil(extent + 2 * reach)) + 1          # the patch side, supersampled pixels
  image_pixels = resolution * resolution
  out = np.empty((n, image_pixels), np.float32)
  group = max(1, _PATCH_PIXELS_PER_BATCH // (m * side * side))     # images per batch
  for begin in range(0, n, group):
    part = segments[begin:begin + group].reshape(-1, 4)
    images = part.shape[0] // m
    ink, index = _patch_ink(*part.T, side, reach, resolution)
    ink *= drawn[begin:begin + group].reshape(-1)[:, None, None] / np.float32(scale * scale)
    index += (np.repeat(np.arange(images), m) * image_pixels)[:, None, None]
    out[begin:begin + images] = np.bincount(index.reshape(-1), ink.reshape(-1),
                                            minlength=images * image_pixels).reshape(images, -1)
  return out.reshape(n, resolution, resolution)


def _patch_ink(x0, y0, x1, y1, side: int, reach: float, resolution: int):
  """Each segment's ink over its patch, `[s, side, side]`, and the image pixel each patch
  pixel falls in (-> index into one image, `[s, side, side]`). Inputs in supersampled pixels."""
  scale = SUPERSAMPLE
  top = np.floor(np.minimum(y0, y1) - reach).astype(np.int64)
  left = np.floor(np.minimum(x0, x1) - reach).astype(np.int64)
  offsets = np.arange(side)
  rows = top[:, None] + offsets                        # [s, side]
  cols = left[:, None] + offsets
  dx, dy = (x1 - x0)[:, None, None], (y1 - y0)[:, None, None]
  rel_x = (cols + 0.5).astype(np.float32)[:, None, :] - x0[:, None, None]    # [s, 1, side]
  rel_y = (rows + 0.5).astype(np.float32)[:, :, None] - y0[:, None, None]    # [s, side, 1]
  length2 = np.maximum(dx * dx + dy * dy, np.float32(1e-12))
  along = np.clip((rel_x * dx + rel_y * dy) / length2, 0.0, 1.0)            # nearest point
  off_x, off_y = rel_x - along * dx, rel_y - along * dy
  distance = np.sqrt(off_x * off_x + off_y * off_y)
  ink = np.clip(reach - distance, 0.0, 1.0)
  inside_rows = (rows >= 0) & (rows < resolution * scale)
  inside_cols = (cols >= 0) & (cols < resolution * scale)
  ink *= inside_rows[:, :, None] & inside_cols[:, None, :]
  pixel_rows = np.clip(rows, 0, resolution * scale - 1) // scale
  pixel_cols = np.clip(cols, 0, resolution * scale - 1) // scale
  index = pixel_rows[:, :, None] * resolution + pixel_cols[:, None, :]
  return ink, index

"""PNG files from arrays with the standard library only (zlib), for image samples.

`write_png` writes 8-bit grayscale (`[height, width]`) or RGB
(`[height, width, 3]`) images: the signature, IHDR, one IDAT (every row with
filter type 0, deflated) and IEND, each chunk with its CRC-32 (PNG
specification, sections 5 and 11). The file is written beside the target and
renamed into place, so an existing file is never left half-written.
"""

import os
import struct
import zlib

import numpy as np

SIGNATURE = b'\x89PNG\r\n\x1a\n'
COLOR_TYPES = {2: 0, 3: 2}      # array rank -> PNG colour type (0 grayscale, 2 RGB)


def chunk(kind: bytes, data: bytes) -> bytes:
  """Length, type, data and the CRC-32 of type + data."""
  return struct.pack('>I', len(data)) + kind + data + struct.pack(
      '>I', zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(pixels: np.ndarray) -> bytes:
  """The PNG encoding of uint8 `[height, width]` or `[height, width, 3]` pixels."""
  pixels = np.asarray(pixels)
  if pixels.dtype != np.uint8 or pixels.ndim not in COLOR_TYPES or (
      pixels.ndim == 3 and pixels.shape[2] != 3):
    raise ValueError(f'PNG pixels must be uint8 [h, w] or [h, w, 3], got {pixels.dtype} '
                     f'{pixels.shape}')
  height, width = pixels.shape[:2]
  header = struct.pack('>IIBBBBB', width, height, 8, COLOR_TYPES[pixels.ndim], 0, 0, 0)
  rows = pixels.reshape(height, -1)
  raw = b''.join(b'\x00' + row.tobytes() for row in rows)     # filter type 0 per row
  return (SIGNATURE + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(raw, 9))
          + chunk(b'IEND', b''))


def write_png(path: str, pixels: np.ndarray) -> None:
  temporary = path + '.tmp'
  with open(temporary, 'wb') as f:
    f.write(png_bytes(pixels))
  os.replace(temporary, path)


def image_grid(images: np.ndarray, levels: int, scale: int = 4, gap: int = 1) -> np.ndarray:
  """Intensity images `[n, height, width, channels]` (0 .. levels - 1) tiled into one uint8
  picture, ceil(sqrt(n)) per row, each pixel `scale` x `scale`, `gap` pixels between.

  Returns `[H, W]` for one channel, `[H, W, 3]` for three.
  """
  n, height, width, channels = images.shape
  pixels = np.round(images.astype(np.float64) * 255.0 / max(levels - 1, 1)).astype(np.uint8)
  pixels = pixels.repeat(scale, axis=1).repeat(scale, axis=2)
  cols = int(np.ceil(np.sqrt(n)))
  rows = -(-n // cols)
  cell_h, cell_w = height * scale + gap, width * scale + gap
  grid = np.zeros((rows * cell_h - gap, cols * cell_w - gap, channels), np.uint8)
  for index in range(n):
    r, c = divmod(index, cols)
    grid[r * cell_h:r * cell_h + height * scale, c * cell_w:c * cell_w + width * scale] = \
        pixels[index]
  return grid[..., 0] if channels == 1 else grid

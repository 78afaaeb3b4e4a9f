"""An independent reader of the PNGs the evaluation writes: header fields and the pixels."""

import struct
import zlib

import numpy as np


def read_png(data: bytes) -> tuple[dict, np.ndarray]:
  """An independent reader of evaluation/png_writer.py's PNGs: header fields and the pixels."""
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  offset, chunks = 8, {}
  while offset < len(data):
    length, kind = struct.unpack('>I4s', data[offset:offset + 8])
    body = data[offset + 8:offset + 8 + length]
    (crc,) = struct.unpack('>I', data[offset + 8 + length:offset + 12 + length])
    assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
    chunks.setdefault(kind, b'')
    chunks[kind] += body
    offset += 12 + length
  width, height, depth, color, _, _, _ = struct.unpack('>IIBBBBB', chunks[b'IHDR'])
  channels = {0: 1, 2: 3}[color]
  raw = zlib.decompress(chunks[b'IDAT'])
  stride = width * channels + 1
  rows = [raw[r * stride:(r + 1) * stride] for r in range(height)]
  assert all(row[0] == 0 for row in rows)              # filter type 0
  pixels = np.frombuffer(b''.join(row[1:] for row in rows), np.uint8)
  shape = (height, width) if channels == 1 else (height, width, 3)
  return dict(width=width, height=height, depth=depth, color=color), pixels.reshape(shape)

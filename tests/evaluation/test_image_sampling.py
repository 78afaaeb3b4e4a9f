"""Image Transformer sampling and the PNG writer.

- `sample_stream` (one `fori_loop` over the whole fixed-size image) equals a
  Python loop that runs the model on BOS and the intensities drawn so far,
  followed by random intensities (the 2D model reads whole images; a causal
  model must not see them), and draws with the same keys; temperature 0 takes
  the most likely intensity.
- `from_stream` inverts `image_data.to_stream` (raster and block-raster).
- The PNG bytes read back with an independent reader here (chunk CRCs,
  inflate, filter bytes) give the pixels; the grid puts each image in its cell.
- eval.py of a trained digits run writes `eval/samples.png`; `eval.image_samples`
  on another task is an error naming the key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.data import image_data
from longformer_jax.evaluation import image_sampling
from longformer_jax.evaluation.png_writer import image_grid, png_bytes, write_png
from tests.support.png_reader import read_png

LEVELS, LENGTH = 17, 64


@pytest.mark.parametrize('temperature', [1.0, pytest.param(0.0, marks=pytest.mark.slow)])
def test_sampler_equals_drawing_from_each_prefix_alone(tiny_model, temperature):
  model, params, _, _ = tiny_model
  key, num = jax.random.PRNGKey(3), 2
  drawn = np.asarray(jax.jit(lambda p: image_sampling.sample_stream(
      model, p, key, num, LENGTH, LEVELS, temperature))(params))
  # Reference: BOS, what was drawn, then noise; one prefix length at a time.
  noise = np.random.default_rng(4).integers(0, LEVELS, (LENGTH, num, LENGTH)).astype(np.int32)
  apply = jax.jit(lambda inputs: model.apply(
      {'params': params}, inputs, image_sampling.image_context(inputs, True))[0])
  expected = np.zeros((num, LENGTH), np.int32)
  for i in range(LENGTH):
    prefix = np.concatenate([np.full((num, 1), LEVELS, np.int32), expected[:, :i],
                             noise[i, :, i + 1:]], axis=1)
    logits = apply(jnp.asarray(prefix))[:, i, :LEVELS]
    if temperature == 0:
      expected[:, i] = np.argmax(np.asarray(logits), axis=-1)
    else:
      expected[:, i] = np.asarray(jax.random.categorical(jax.random.fold_in(key, i), logits))
  np.testing.assert_array_equal(drawn, expected)
  assert drawn.min() >= 0 and drawn.max() < LEVELS


@pytest.mark.parametrize('layout,block', [('1d', (1, 1)), ('2d', (2, 4)), ('2d', (4, 2))])
def test_from_stream_inverts_to_stream(layout, block):
  images = np.random.default_rng(0).integers(0, LEVELS, (3, 8, 8, 1))
  source = image_data.image_source('digits')
  stream = image_data.to_stream(images, layout, *block)
  np.testing.assert_array_equal(image_sampling.from_stream(stream, source, layout, *block),
                                images)


@pytest.mark.parametrize('shape', [(5, 7), (4, 6, 3)])
def test_png_reads_back_the_pixels(shape, tmp_path):
  pixels = np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)
  path = str(tmp_path / 'x.png')
  write_png(path, pixels)
  header, read = read_png(open(path, 'rb').read())
  assert (header['width'], header['height'], header['depth']) == (shape[1], shape[0], 8)
  np.testing.assert_array_equal(read, pixels)
  with pytest.raises(ValueError, match='uint8'):
    png_bytes(pixels.astype(np.float32))


def test_grid_places_each_image_in_its_cell():
  images = np.arange(5)[:, None, None, None] * np.ones((5, 2, 3, 1), int)   # image k: all k
  grid = image_grid(images, levels=5, scale=2, gap=1)
  assert grid.shape == (2 * 5 - 1, 3 * 7 - 1)                 # 3 per row, 2 rows
  for k in range(5):
    r, c = divmod(k, 3)
    cell = grid[r * 5:r * 5 + 4, c * 7:c * 7 + 6]
    np.testing.assert_array_equal(cell, np.full((4, 6), round(k * 255 / 4), np.uint8))

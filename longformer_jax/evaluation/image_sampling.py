"""Drawing images from a trained image-task model, position by position (Image Transformer).

`sample_stream` fills `[num, L]` intensities in the run's generation order
(raster for local 1D, block-raster for 2D, `data/image_data.py`): at step i
the model reads BOS and the i intensities drawn so far and the i-th output
(a distribution over the `levels` intensities) gives intensity i. The whole
image is run at every step; because the decoder is causal, the slots after i
do not change output i, so a fixed-size input works under one `fori_loop`
(L forward passes of length L; a key/value cache would make each step
O(L)). `from_stream` undoes the generation order; `evaluation/png_writer.py`
saves the grid.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from longformer_jax.data import image_data
from longformer_jax.evaluation.png_writer import image_grid, write_png
from longformer_jax.models.image_decoder import image_context


def sample_stream(model, params, key: jax.Array, num_images: int, length: int, levels: int,
                  temperature: float = 1.0) -> jax.Array:
  """int32 `[num_images, length]` intensities; step i samples with `fold_in(key, i)`
  (temperature 0: the most likely intensity)."""
  inputs = jnp.zeros((num_images, length), jnp.int32).at[:, 0].set(levels)   # BOS = levels
  ctx = image_context(inputs, deterministic=True)

  def step(i, carry):
    inputs, drawn = carry
    logits, _ = model.apply({'params': params}, inputs, ctx)
    logits = jax.lax.dynamic_index_in_dim(logits, i, axis=1, keepdims=False)[:, :levels]
    if temperature == 0:
      choice = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
      choice = jax.random.categorical(jax.random.fold_in(key, i), logits / temperature)
    drawn = drawn.at[:, i].set(choice.astype(jnp.int32))
    following = jnp.minimum(i + 1, length - 1)
    inputs = jnp.where(i + 1 < length, inputs.at[:, following].set(choice), inputs)
    return inputs, drawn
  _, drawn = jax.lax.fori_loop(0, length, step, (inputs, jnp.zeros_like(inputs)))
  return drawn


def from_stream(stream: np.ndarray, source: image_data.ImageSource, layout: str = '1d',
                block_height: int = 1, block_width: int = 1) -> np.ndarray:
  """Inverse of `image_data.to_stream`: `[n, L]` -> `[n, height, width, channels]`."""
  stream = np.asarray(stream)
  n = stream.shape[0]
  if layout == '2d':
    raster = np.empty_like(stream)
    raster[:, image_data.block_raster_order(source.height, source.row_len, block_height,
                                            block_width)] = stream
    stream = raster
  return stream.reshape(n, source.height, source.width, source.channels)


def save_samples(config: ml_collections.ConfigDict, model, params, path: str) -> np.ndarray:
  """Draws `config.eval.image_samples` images (key `PRNGKey(config.seed)`, temperature
  `config.eval.sample_temperature`), saves their grid as a PNG at `path`; returns them
  `[n, height, width, channels]`."""
  source = image_data.image_source(config.data.corpus)
  draw = jax.jit(lambda p, key: sample_stream(model, p, key, config.eval.image_samples,
                                              source.length, source.levels,
                                              config.eval.sample_temperature))
  stream = np.asarray(draw(params, jax.random.PRNGKey(config.seed)))
  images = from_stream(stream, source, *image_data.stream_layout(config.model))
  write_png(path, image_grid(images, source.levels))
  return images

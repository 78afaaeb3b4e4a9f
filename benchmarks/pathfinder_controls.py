r"""Controls for Pathfinder: is the generated task learnable at a budget, by other means?

  python -m benchmarks.pathfinder_controls --control=cnn [--steps=3000]
      [--train_examples=20000] [--setting=data.pathfinder.KEY=VALUE ...]
  python -m benchmarks.pathfinder_controls --control=cnn --label=marker_side --steps=500
  python -m benchmarks.pathfinder_controls --control=components

Vanilla attention stays at chance on the mini Pathfinder (docs/lra.md). Two controls
say whether that is the attention's failing or the task's at the budget:

  cnn          a small convolutional network (4 stages of two 3 x 3 convolutions, 32, 32,
               64, 64 channels, 2 x 2 max pooling, a 128-unit layer; Adam at 1e-3, batches of
               64 drawn with replacement from `--train_examples` generated images), the
               usual first model for a vision task, with the image's two dimensions and
               locality built in. `--label=marker_side` trains the same network on a label
               read off the pixels locally (is the second marker in the image's left half?):
               it shows the loop learns, so that a plateau on the real label is the task's.
               With `--setting=data.pathfinder.curriculum_steps=N` its first N steps read
               the path-length curriculum's images, as train.py's do.
  components   a rule on the pixels told the markers' centres (a reference, like
               `known_cut_groups` for Text, not a shortcut): threshold the image, dilate it,
               and say "connected" when both markers fall in one connected component. The
               threshold (1, 32, 96) and dilation (0, 1, 2 pixels) are chosen on the
               training images and scored on the test images.

Data: `configs/lra.py:pathfinder,vanilla,SCALE`'s generator with the `--setting`s applied
(`data.` keys, as benchmarks/lra_shortcuts.py takes them), tested on the same 2,000
generated test images as the models. Rows go into benchmarks/results/lra/accuracy.json
(variant `cnn_control`, `cnn_control_marker_side` or `connected_components`, seed 0),
the CNN's with its test accuracy at every evaluation.
"""

import argparse
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import ndimage

from benchmarks.lra_results import ACCURACY_KEY, merge_rows
from benchmarks.lra_shortcuts import data_settings, pathfinder_data, pathfinder_section
from configs import lra
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.curriculum_streams import require_steps_after
from longformer_jax.data.lra import pathfinder

THRESHOLDS, DILATIONS = (1, 32, 96), (0, 1, 2)


def labels_of(split: pathfinder.PathfinderSplit, label: str) -> np.ndarray:
  """`[n]` int32: the task's label, or whether marker 1 sits in the left half."""
  if label == 'path':
    return split.labels.astype(np.int32)
  side = split.images.shape[-1] / 2
  return (split.markers[:, 1, 0] < side).astype(np.int32)


class ConvNet(nn.Module):
  """`[batch, height, width, 1]` in [0, 1] -> `[batch, 2]` logits."""

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    x = images
    for features in (32, 32, 64, 64):
      x = nn.relu(nn.Conv(features, (3, 3))(x))
      x = nn.relu(nn.Conv(features, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), (2, 2))
    x = nn.relu(nn.Dense(128)(x.reshape(x.shape[0], -1)))
    return nn.Dense(2)(x)


def train_cnn(train_x, train_y, test_x, test_y, steps: int, batch_size: int,
              eval_every: int, seed: int = 0, first=None) -> list[tuple[int, float, float]]:
  """`[(step, mean training loss since the last evaluation, test accuracy)]`. `first`:
  `(images, labels, switch)` read instead of the training set for steps 1..switch (the
  path-length curriculum)."""
  model, optimizer = ConvNet(), optax.adam(1e-3)
  params = model.init(jax.random.PRNGKey(seed), train_x[:1])
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, x, y):
    def loss_fn(p):
      return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  correct = jax.jit(lambda p, x, y: jnp.sum(jnp.argmax(model.apply(p, x), -1) == y))
  rng, losses, curve = np.random.default_rng(seed), [], []
  for i in range(1, steps + 1):
    images, labels = (first[0], first[1]) if first and i <= first[2] else (train_x, train_y)
    index = rng.integers(0, len(images), batch_size)
    params, opt_state, loss = step(params, opt_state, images[index], labels[index])
    losses.append(loss)                      # synced at the evaluation, not every step
    if i % eval_every == 0 or i == steps:
      hits = sum(int(correct(params, test_x[j:j + 500], test_y[j:j + 500]))
                 for j in range(0, len(test_x), 500))
      curve.append((i, float(jnp.mean(jnp.stack(losses))), hits / len(test_x)))
      losses = []
      print(f'step {i}: loss {curve[-1][1]:.4f}, test accuracy {curve[-1][2]:.4f}', flush=True)
  return curve


def curriculum_data(scale: str, count: int, settings: tuple, steps: int):
  """`(split, switch)`: the training images of the path-length curriculum's first stage
  (`data.pathfinder.curriculum_steps` among `settings`) and its steps; None when it is off.

  Raises:
    ConfigError: the curriculum leaves no step of `steps` for the task's paths.
  """
  section = pathfinder_section(scale, settings)
  if not section.curriculum_steps:
    return None
  require_steps_after('data.pathfinder.curriculum_steps', section.curriculum_steps, steps,
                      '--steps', f'the paths of dashes_per_path={section.dashes_per_path}')
  return (pathfinder.pathfinder_split(pathfinder.curriculum_config(section), 'train', count),
          section.curriculum_steps)


def marker_pixel(marker: np.ndarray, side: int) -> tuple[int, int]:
  """(row, column) of the pixel under a marker centre (x along a row)."""
  clip = lambda v: int(np.clip(np.floor(v), 0, side - 1))
  return clip(marker[1]), clip(marker[0])


def components_predictions(split: pathfinder.PathfinderSplit, threshold: int,
                           dilation: int) -> np.ndarray:
  """`[n]`: 1 where both markers fall in one connected component of the dilated image."""
  structure = ndimage.generate_binary_structure(2, 2)       # 8-connected
  out = np.zeros(len(split.labels), np.int32)
  for i, (image, markers) in enumerate(zip(split.images, split.markers)):
    ink = image >= threshold
    if dilation:
      ink = ndimage.binary_dilation(ink, structure, iterations=dilation)
    components, _ = ndimage.label(ink, structure)
    first, second = (components[marker_pixel(m, image.shape[0])] for m in markers)
    out[i] = int(first == second and first != 0)
  return out


def components_row(train, test) -> dict:
  """The rule's test accuracy at the (threshold, dilation) best on the training images."""
  scores = {(t, d): float(np.mean(components_predictions(train, t, d) == train.labels))
            for t in THRESHOLDS for d in DILATIONS}
  threshold, dilation = max(scores, key=scores.get)
  accuracy = float(np.mean(components_predictions(test, threshold, dilation) == test.labels))
  return {'variant': 'connected_components', 'accuracy': round(accuracy, 4),
          'threshold': threshold, 'dilation': dilation,
          'train_accuracy': round(scores[(threshold, dilation)], 4)}


def cnn_row(train, test, label: str, steps: int, batch_size: int, eval_every: int,
            first=None) -> dict:
  """`first`: `(split, switch)`, the curriculum's images read for the first `switch` steps."""
  to_input = lambda s: s.images.astype(np.float32)[..., None] / 255.0
  start = time.perf_counter()
  if first:
    first = (to_input(first[0]), labels_of(first[0], label), first[1])
  curve = train_cnn(to_input(train), labels_of(train, label), to_input(test),
                    labels_of(test, label), steps, batch_size, eval_every, first=first)
  name = 'cnn_control' if label == 'path' else f'cnn_control_{label}'
  return {'variant': name, 'accuracy': round(curve[-1][2], 4), 'steps': steps,
          'batch_size': batch_size, 'train_seconds': round(time.perf_counter() - start, 1),
          'curve': [[s, round(loss, 4), round(acc, 4)] for s, loss, acc in curve]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--control', choices=('cnn', 'components'), required=True)
  parser.add_argument('--label', choices=('path', 'marker_side'), default='path')
  parser.add_argument('--scale', default='mini', choices=lra.SCALES)
  parser.add_argument('--steps', type=int, default=3000)
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--eval_every', type=int, default=250)
  parser.add_argument('--train_examples', type=int, default=20_000)
  parser.add_argument('--test_examples', type=int, default=2_000)
  parser.add_argument('--results', default='benchmarks/results/lra/accuracy.json')
  parser.add_argument('--setting', action='append', default=[],
                      help='data.pathfinder.KEY=VALUE: the data of a fair try (repeatable)')
  args = parser.parse_args(argv)
  if min(args.steps, args.batch_size, args.eval_every, args.train_examples,
         args.test_examples) < 1:
    print('error: --steps, --batch_size, --eval_every, --train_examples and --test_examples '
          'must be >= 1', file=sys.stderr)
    return 2
  if args.control == 'components' and args.label != 'path':
    print('error: --label applies to --control=cnn only', file=sys.stderr)
    return 2
  try:
    settings = data_settings(args.setting)
    train = pathfinder_data(args.scale, 'train', args.train_examples, settings)
    test = pathfinder_data(args.scale, 'test', args.test_examples, settings)
    first = curriculum_data(args.scale, args.train_examples, settings, args.steps)
  except (ValueError, ConfigError) as error:
    print(f'error: {error}', file=sys.stderr)
    return 2
  if args.control == 'cnn':
    row = cnn_row(train, test, args.label, args.steps, args.batch_size, args.eval_every, first)
    command = (f'python -m benchmarks.pathfinder_controls --control=cnn --label={args.label} '
               f'--steps={args.steps} --train_examples={args.train_examples}')
  else:
    row = components_row(train, test)
    command = (f'python -m benchmarks.pathfinder_controls --control=components '
               f'--train_examples={args.train_examples}')
  command += ''.join(f' --setting={s}' for s in settings)
  row = {'task': 'pathfinder', 'scale': args.scale, 'seed': 0, **row,
         'train_examples': args.train_examples, 'test_examples': args.test_examples,
         'command': command, **({'settings': ' '.join(settings)} if settings else {})}
  merge_rows(args.results, [row], ACCURACY_KEY)
  print(f"pathfinder {row['variant']} {row['accuracy']:.4f}")
  return 0


if __name__ == '__main__':
  sys.exit(main())

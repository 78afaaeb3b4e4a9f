"""Pathfinder (Linsley et al., 2018), the Long Range Arena's image task (Tay et al., 2020).

An image shows two target paths and some distractor paths, each a chain of short dashes,
and two marker discs on path ends. The label is 1 if the markers sit on the two ends of one
path, 0 if they sit on ends of the two target paths. The image's 8-bit grey pixels, flattened
row by row, are the tokens: 32x32 = 1,024 (Pathfinder-32), 128x128 = 16,384 (Path-X).

The scene, in units of pixels of a 32x32 image (at resolution r every length is scaled by
r / 32: Path-X draws the same scenes four times finer, so only the sequence grows):
- Dashes of length `dash_length`. A path grows dash by dash: the next dash starts `margin`
  past a pivot that lies `margin` beyond the last dash's end (a gap of 2 x margin, as the
  original generator's pivots), turned from the last dash by an angle drawn with weight
  cos^2(min(continuity x angle, pi/2)) among the free turns: smooth contours, every turn
  under 90 degrees (`pathfinder_paths`).
- No two dashes touch: every dash keeps a centreline distance of `margin + dash_thickness`
  (a gap of `margin` between the strokes' edges) from every other dash, of its own path
  (all but its neighbours in the chain) and of every other path: the original's occupancy
  mask dilated by the margin, tested exactly on the segments. So two paths may pass closer
  (`margin`) than a path's own consecutive dashes lie (2 x margin): what tells them apart
  is the continuity of direction. `path_gap` widens the gap between non-neighbours to
  `margin + path_gap` (0, the default, is the original's), an easier setting in which
  following the ink across a path's own gaps never jumps to another path.
- The two target paths start `seed_distance` apart near the middle (the first seed end at
  least `seed_distance` inside the border box) and grow one dash each in turn, so they wind
  around each other; they then trade names with probability 1/2, so that they are
  exchangeable. A path that finds no room backs up `BACKTRACK_DASHES` dashes (both paths) and
  grows again; after `MAX_BACKTRACKS` back-ups the scene starts afresh. Every dash stays
  `marker_radius` inside the image, so a marker on any end fits.
- Distractors: paths of dashes_per_path // 3 dashes, `distractor_dashes` // that many of
  them (the original: contour_length / 3 and 30 / distractor_length, about 30 distractor
  dashes at every difficulty), each seeded at a random free spot if it fits
  (`DISTRACTOR_TRIES` tries, like the original's retrials), else left out. With the
  defaults about 15.0 of 15 (6 dashes per path), 9.7 of 10 (9) and 5.7 of 7 (14) fit.
- Marker discs of radius `marker_radius`: one on the seed end of a target path, one on a far
  end: of the same path (label 1) or of the other one (label 0). A positive and a negative
  image differ only in which ends are marked.

Parameters: the original's for Pathfinder-32 (dash length 2, thickness 0.5, margin 1, marker
radius 1.5, seed distance 7, continuity 1.0). Difficulty is the path length: LRA's hard set
has 14 dashes per path (the default), 9 is the intermediate and 6 the easy baseline; paths
of more than 20 dashes seldom fit. The distractor budget is the original's (30 dashes), the
same at 32 and 128 pixels since Path-X scales the scene rather than filling a larger one.

The marker distance is balanced. A positive's markers are the two ends of one path, a
negative's the ends of two, so their distances need not share a distribution. A scene
offers four couples (`pathfinder_paths.COUPLES`): a positive pair and a negative pair of
marked ends sharing one end. The two target paths' last dashes are drawn together, among the
free pairs of turns for which some couple's positive and negative marker distances differ by
at most `distance_tolerance`; one such couple is chosen, and only then does the label pick
its positive or its negative pair. Scene and couple never look at the label, so the two
classes' marker distances agree up to the tolerance, example by example.

Labels are exactly balanced: examples 2j and 2j + 1 take labels 0 and 1 in a random order.
Randomness is counter-based (SplitMix64's finaliser over (seed, split, example, draw)):
example i of a split depends only on (seed, split, i) and the drawing parameters, so the
first N examples are the same whatever count is asked, and the test split is the same for
every model seed. (Across machines, the libm behind numpy's cos and sin could round a last
bit differently and flip a rare borderline choice.) Scenes grow for thousands of examples at
once in lockstep (numpy, float32 coordinates), each from its own draws, and are drawn by
`pathfinder_drawing.render`.
"""

import dataclasses

import numpy as np

from longformer_jax.config.section import Section
from longformer_jax.data.lra import pathfinder_drawing, pathfinder_paths

SPLITS = ('train', 'valid', 'test')
SCENE_SIDE = 32.0            # the scene's side in its own units (pixels of a 32x32 image)
DISTRACTOR_TRIES = 4         # placements tried per distractor path before it is left out
BACKTRACK_DASHES = 3         # dashes a target path backs up (both paths) when it finds no room
MAX_BACKTRACKS = 8           # back-ups before an example starts afresh from new seeds
MAX_ROUNDS = 10_000          # rounds per example before the parameters are refused
LANES = 4096                 # examples grown together in lockstep
BLOCK = 16_384               # examples generated at a time
RENDER_PIXELS = 1 << 22      # image pixels drawn at a time
_STAGE_TARGETS, _STAGE_DISTRACTORS, _STAGE_CHOICE, _STAGE_LABEL = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class PathfinderConfig(Section):
  """The Pathfinder generator's settings; lengths in pixels of a 32x32 image (scaled by
  resolution / 32)."""
  resolution: int = 32               # image side (32: Pathfinder-32, 128: Path-X)
  dashes_per_path: int = 14          # LRA's hard set; 6: easy, 9: medium
  distractor_dashes: int = 30        # dashes over all distractor paths (the original's 30)
  dash_length: float = 2.0           # one dash's length
  dash_thickness: float = 0.5        # one dash's stroke width
  margin: float = 1.0                # gap between strokes; half the gap between a path's dashes
  path_gap: float = 0.0              # extra gap between dashes that are not neighbours (0: original)
  marker_radius: float = 1.5         # the marker discs' radius; dashes stay this far inside
  seed_distance: float = 7.0         # distance between the two target paths' first dashes
  continuity: float = 1.0            # turn weight cos^2(min(continuity x angle, pi/2))
  distance_tolerance: float = 0.5    # most a couple's positive and negative marker distances differ
  train_examples: int = 160_000      # full scale (LRA: 80/10/10 of its 200k images per difficulty)
  valid_examples: int = 2_000
  test_examples: int = 2_000
  seed: int = 0                      # the data's own seed, independent of config.seed
  # Path-length curriculum (data/curriculum_streams.py): the first N training steps read
  # images whose paths have `curriculum_dashes` dashes, in the same geometry; 0: off.
  curriculum_steps: int = 0
  curriculum_dashes: int = 2

  def validate(self, env) -> None:
    del env
    self.require(16 <= self.resolution <= 512, 'resolution', 'must be in 16..512')
    self.require(2 <= self.dashes_per_path <= 20, 'dashes_per_path',
                 'must be in 2..20 (longer paths seldom fit the 32-pixel scene)')
    self.require(0 <= self.distractor_dashes <= 256, 'distractor_dashes', 'must be in 0..256')
    self.require(0 < self.dash_length <= 8, 'dash_length', 'must be in (0, 8]')
    self.require(0 < self.dash_thickness <= 4, 'dash_thickness', 'must be in (0, 4]')
    self.require(0 < self.margin <= 4, 'margin', 'must be in (0, 4]')
    self.require(0 <= self.path_gap <= 4, 'path_gap', 'must be in [0, 4]')
    self.require(0 < self.marker_radius <= 4, 'marker_radius', 'must be in (0, 4]')
    self.require(self.seed_distance >= self.clearance, 'seed_distance',
                 'must be >= margin + path_gap + dash_thickness (the seeds keep the dashes\' '
                 'clearance)')
    self.require(self.seed_distance + self.marker_radius < SCENE_SIDE / 2, 'seed_distance',
                 'plus marker_radius must be < 16 (the first seed needs room in the middle)')
    self.require(1 <= self.continuity <= 10, 'continuity',
                 'must be in 1..10 (1: turns up to 90 degrees)')
    self.require(self.distance_tolerance > 0, 'distance_tolerance', 'must be > 0')
    for name in ('train_examples', 'valid_examples', 'test_examples'):
      self.require(getattr(self, name) >= 1, name, 'must be >= 1')
    self.require(0 <= self.seed < 2 ** 63, 'seed', 'must be in 0..2**63-1')
    self.require(self.curriculum_steps >= 0, 'curriculum_steps', 'must be >= 0 (0: off)')
    if self.curriculum_steps:
      self.require(2 <= self.curriculum_dashes <= self.dashes_per_path, 'curriculum_dashes',
                   f'must be in 2..dashes_per_path ({self.dashes_per_path}): the curriculum '
                   'reads shorter paths first')

  @property
  def distractor_length(self) -> int:
    """Dashes per distractor path (the original's contour_length / 3)."""
    return max(1, self.dashes_per_path // 3)

  @property
  def distractor_paths(self) -> int:
    return self.distractor_dashes // self.distractor_length

  @property
  def clearance(self) -> float:
    """The least centreline distance between two dashes that are not neighbours in a path."""
    return self.margin + self.path_gap + self.dash_thickness

  def split_size(self, split: str) -> int:
    return getattr(self, f'{split}_examples')


def curriculum_config(config: PathfinderConfig) -> PathfinderConfig:
  """The settings of the curriculum's first stage: the same generator with
  `curriculum_dashes` dashes per path (distractors of their length)."""
  return dataclasses.replace(config, dashes_per_path=config.curriculum_dashes,
                             curriculum_steps=0)


@dataclasses.dataclass(frozen=True)
class PathfinderSplit:
  """Generated examples and the generator's record of each; coordinates (x, y) in image
  pixels (x along a row), see `pathfinder_drawing`.

  Attributes:
    images: uint8 `[n, resolution, resolution]`.
    labels: int32 `[n]`, 1: the markers are on the two ends of one path.
    target_dashes: float32 `[n, 2, dashes_per_path, 2, 2]`: per target path, its dashes in
      order from its seed end, each (start, end); the seed end is dash 0's start, the far end
      the last dash's end.
    distractor_dashes: float32 `[n, distractor_paths, distractor_length, 2, 2]`, NaN for a
      distractor path that did not fit.
    markers: float32 `[n, 2, 2]`: marker 0's and marker 1's centres.
    marker_path: int8 `[n, 2]`: the target path (0 or 1) each marker sits on.
    marker_end: int8 `[n, 2]`: the end it sits on (0: the seed end, 1: the far end).
    example_ids: int64 `[n]`: each example's index in its split.
  """
  images: np.ndarray
  labels: np.ndarray
  target_dashes: np.ndarray
  distractor_dashes: np.ndarray
  markers: np.ndarray
  marker_path: np.ndarray
  marker_end: np.ndarray
  example_ids: np.ndarray


def pathfinder_split(config: PathfinderConfig, split: str, count: int | None = None,
                     start: int = 0) -> PathfinderSplit:
  """Examples `start .. start + count - 1` of `split` ('train', 'valid' or 'test'); `count`
  defaults to the split's `*_examples` (less `start`). Example i is the same in any call
  that includes it."""
  if split not in SPLITS:
    raise ValueError(f'split {split!r} is not one of {SPLITS}')
  count = config.split_size(split) - start if count is None else count
  if count < 0 or start < 0:
    raise ValueError(f'count ({count}) and start ({start}) must be >= 0')
  blocks = [_examples(config, split, np.arange(begin, min(begin + BLOCK, start + count)))
            for begin in range(start, start + count, BLOCK)]
  if not blocks:
    blocks = [_examples(config, split, np.arange(0))]
  return PathfinderSplit(*(np.concatenate(parts) for parts in zip(*(
      dataclasses.astuple(block) for block in blocks))))


def _examples(config: PathfinderConfig, split: str, ids: np.ndarray) -> PathfinderSplit:
  """The examples `ids` `[n]` of `split`."""
  count, path_count = ids.size, config.dashes_per_path
  keys = example_keys(config.seed, split, ids)
  dashes, couples = _target_scenes(config, keys)
  # The two paths trade names with probability 1/2 (A <-> B maps couple c to c + 2), so that
  # they are exchangeable: path A's seed is the one placed first, nearer the middle.
  swap = _uniform(keys, _counter(_STAGE_CHOICE, 0, 0, 0, 0)) < 0.5
  dashes[swap] = dashes[swap].reshape(-1, path_count, 2, 4)[:, :, ::-1].reshape(
      -1, 2 * path_count, 4)
  couples = np.where(swap, (couples + 2) % 4, couples)
  labels = _labels(config.seed, split, ids)
  distractors = _distractors(config, keys, dashes)
  ends = _couple_ends(couples, labels)                                  # [n, 2, 2]
  per_path = dashes.reshape(count, path_count, 2, 4)                    # slot 2k + p
  per_path = per_path.transpose(0, 2, 1, 3).reshape(count, 2, path_count, 2, 2)
  row = np.arange(count)[:, None]
  marker_path, marker_end = ends[..., 0], ends[..., 1]
  markers = per_path[row, marker_path, np.where(marker_end == 1, path_count - 1, 0), marker_end]
  scale = np.float32(config.resolution / SCENE_SIDE)
  all_dashes = np.concatenate([dashes, distractors], axis=1).reshape(
      count, dashes.shape[1] + distractors.shape[1], 2, 2)
  images = np.empty((count, config.resolution, config.resolution), np.uint8)
  chunk = max(1, RENDER_PIXELS // config.resolution ** 2)
  for begin in range(0, count, chunk):
    part = slice(begin, begin + chunk)
    images[part] = pathfinder_drawing.render(
        all_dashes[part] * scale, markers[part] * scale, config.resolution,
        config.dash_thickness * scale, config.marker_radius * scale)
  return PathfinderSplit(
      images=images, labels=labels.astype(np.int32),
      target_dashes=(per_path * scale).astype(np.float32),
      distractor_dashes=(distractors * scale).astype(np.float32).reshape(
          count, config.distractor_paths, config.distractor_length, 2, 2),
      markers=(markers * scale).astype(np.float32), marker_path=marker_path.astype(np.int8),
      marker_end=marker_end.astype(np.int8), example_ids=ids.astype(np.int64))


# Counter-based randomness: a draw is a hash of (example key, counter), so an example's draws
# do not depend on which other examples are grown beside it.
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: np.ndarray) -> np.ndarray:
  """SplitMix64's finaliser (Steele et al., 2014) on uint64 arrays, wrapping arithmetic."""
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
  x = (x ^ (x >> 27)) * 0x94D049BB133111EB
  return x ^ (x >> 31)


def example_keys(seed: int, split: str, ids: np.ndarray) -> np.ndarray:
  """uint64 `[n]`: the key of each example of `split` (a pure function of seed, split, id)."""
  base = _mix(np.array([seed], np.uint64))
  base = _mix(base ^ np.array([SPLITS.index(split) + 1], np.uint64) * _GOLDEN)
  return _mix(base ^ _mix(np.asarray(ids, np.uint64) + np.uint64(_GOLDEN)))


def _uniform(keys: np.ndarray, counters) -> np.ndarray:
  """float64 uniforms in [0, 1), one per key, a pure function of (key, counter)."""
  counters = np.broadcast_to(np.asarray(counters, np.uint64), keys.shape)
  bits = _mix(keys + (counters + np.uint64(1)) * np.uint64(_GOLDEN))
  return (bits >> 11).astype(np.float64) * 2.0 ** -53


def _counter(stage: int, attempt, step: int, trial: int, slot: int):
  """The counter of one draw: stage (2 bits), attempt (24), step (10), trial (6), slot (4)."""
  high = (np.asarray(attempt, np.uint64) + np.uint64(stage << 24)) << 20
  return high + np.uint64((step << 10) + (trial << 4) + slot)


def _labels(seed: int, split: str, ids: np.ndarray) -> np.ndarray:
  """int64 `[n]`: examples 2j and 2j + 1 hold labels 0 and 1 in a random order."""
  pair_keys = example_keys(seed, split, ids // 2)
  flip = _uniform(pair_keys, _counter(_STAGE_LABEL, 0, 0, 0, 0)) < 0.5
  return (ids % 2) ^ flip.astype(np.int64)


def _couple_ends(couples: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """int64 `[n, 2, 2]`: each marker's (target path, end) for the chosen couple and label
  (`pathfinder_paths.COUPLES`: label 1 marks the couple's positive pair, 0 its negative)."""
  ends = np.array([[negative, positive] for positive, negative in pathfinder_paths.COUPLES])
  marked = ends[couples, labels]                                    # [n, 2] in 0..3
  return np.stack([marked // 2, marked % 2], axis=-1)


def _geometry(config: PathfinderConfig) -> pathfinder_paths.PathGeometry:
  return pathfinder_paths.PathGeometry(
      dash_length=config.dash_length, margin=config.margin, clearance=config.clearance,
      continuity=config.continuity, low=config.marker_radius,
      high=SCENE_SIDE - config.marker_radius, seed_distance=config.seed_distance,
      tolerance=config.distance_tolerance)


def _drawer(keys: np.ndarray, stage: int, attempts: np.ndarray):
  """draw(step, trial, slot, rows): uniforms for the lanes `rows` of `keys`."""
  def draw(step, trial, slot, rows):
    return _uniform(keys[rows], _counter(stage, attempts[rows], step, trial, slot))
  return draw


def _target_scenes(config: PathfinderConfig, keys: np.ndarray):
  """Every example's two target paths and its couple: float32 `[n, 2 x dashes_per_path, 4]`
  (slot 2k + p: dash k of path p, (x0, y0, x1, y1) in scene units) and int64 `[n]`.

  Examples grow in rounds, `LANES` at a time (a queue); a round grows an example's paths
  from its start step to the end, with the round's own draws. Where a path finds no room
  (or no pair of last dashes balances), both paths back up `BACKTRACK_DASHES` dashes and
  grow again in the example's next round; after `MAX_BACKTRACKS` back-ups the example starts
  afresh from new seeds."""
  count, slots = keys.size, 2 * config.dashes_per_path
  scenes = np.full((count, slots, 4), pathfinder_paths.FAR, pathfinder_paths.DTYPE)
  couples = np.zeros(count, np.int64)
  start = np.zeros(count, np.int64)
  rounds = np.zeros(count, np.int64)
  backtracks = np.zeros(count, np.int64)
  queue = np.arange(count)
  geometry = _geometry(config)
  while queue.size:
    lanes, queue = queue[:LANES], queue[LANES:]
    segments = scenes[lanes]
    draw = _drawer(keys[lanes], _STAGE_TARGETS, rounds[lanes])
    failed, couples[lanes] = pathfinder_paths.grow_targets(geometry, draw, segments,
                                                           start[lanes])
    rounds[lanes] += 1
    if rounds[lanes].max() >= MAX_ROUNDS:
      raise ValueError(f'no Pathfinder scene in {MAX_ROUNDS} rounds: the paths do not fit '
                       '(fewer dashes_per_path, a smaller margin or dash_length)')
    again = failed >= 0
    retry = lanes[again]
    backtracks[retry] += 1
    start[retry] = np.maximum(2, failed[again] - 2 * BACKTRACK_DASHES)
    afresh = retry[backtracks[retry] > MAX_BACKTRACKS]
    start[afresh] = backtracks[afresh] = 0
    cleared = np.arange(slots)[:, None] >= start[retry, None, None]
    segments[again] = np.where(cleared, pathfinder_paths.FAR, segments[again])
    scenes[lanes] = segments
    queue = np.concatenate([queue, retry])
  return scenes, couples


def _distractors(config: PathfinderConfig, keys: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """float32 `[n, distractor_paths x distractor_length, 4]`: the distractor paths that fit
  beside `targets` and the distractors before them (up to `DISTRACTOR_TRIES` spots each),
  NaN where a path did not fit."""
  count, first = keys.size, targets.shape[1]
  length = config.distractor_length
  total = config.distractor_paths * length
  out = np.full((count, total, 4), np.nan, np.float32)
  geometry = _geometry(config)
  for begin in range(0, count, LANES):
    part = keys[begin:begin + LANES]
    segments = np.concatenate([targets[begin:begin + LANES],
                               np.full((part.size, total, 4), pathfinder_paths.FAR,
                                       pathfinder_paths.DTYPE)], axis=1)
    for path in range(config.distractor_paths):
      pending = np.arange(part.size)
      for retry in range(DISTRACTOR_TRIES):
        attempt = np.full(part.size, path * DISTRACTOR_TRIES + retry)
        grown = pathfinder_paths.grow_path(geometry, _drawer(part, _STAGE_DISTRACTORS, attempt),
                                           segments, pending, first + path * length, length)
        pending = pending[~grown]
        if not pending.size:
          break
    grown = segments[:, first:]
    out[begin:begin + LANES] = np.where(grown >= pathfinder_paths.FAR / 2, np.nan, grown)
  return out

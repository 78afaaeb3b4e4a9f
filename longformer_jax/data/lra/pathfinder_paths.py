"""Pathfinder's paths: chains of dashes grown in lockstep for many scenes, never touching.

A dash is a segment (x0, y0, x1, y1) in scene units (pixels of a 32x32 image), all of length
`dash_length`. A path starts with a seed dash and grows one dash at a time (Linsley et al.,
2018): the next dash starts `margin` past a pivot that lies `margin` beyond the last dash's
end, turned from it by an angle with weight cos^2(min(continuity x angle, pi/2)), among the
turns that keep the new dash clear of every dash drawn so far. The turns weighed are
`TURN_CANDIDATES` angles spread evenly over (-pi / (2 continuity), pi / (2 continuity)) with
one random offset per step (the original generator weighed the pixels of a circle around the
pivot); a path with no free turn fails. Two dashes are clear when their centrelines stay
`clearance` apart; a dash is not tested against the one before it in its own path, which the
pivot keeps 2 x margin x cos(turn / 2) away.

The two target paths grow one dash each in turn. Their last dashes are drawn together, so
that the marker distances balance: of the free pairs of last turns (weight: the product of
the two turns' weights, the two new dashes clear of each other), only those where some
couple's positive and negative marker distances differ by at most `tolerance` are kept
(`COUPLES`), and a balanced couple of the pair drawn is chosen.

Each lane (one scene) draws its own random numbers through `draw(step, trial, slot, rows)`:
uniforms for the lanes `rows`, a pure function of the lane's scene, the step, the trial and
the slot, so a scene does not depend on which other scenes grow beside it.
"""

import dataclasses
from typing import Callable

import numpy as np

TURN_CANDIDATES = 10     # turns weighed per dash
SEED_TRIES = 8           # random spots tried for a seed dash before the path fails
DTYPE = np.float32       # the coordinates' type (float32: half the memory traffic)
FAR = 1e6                # the coordinates of an empty dash slot (never near anything)
# A scene's couples: (positive pair, negative pair) of marked ends sharing one end; a pair is
# (one path's seed end, a far end). Ends: 0 = path A's seed end, 1 = A's far end, 2 = B's
# seed end, 3 = B's far end. COUPLES[c] = ((seed, far) positive, (seed, far) negative).
COUPLES = (((0, 1), (0, 3)), ((0, 1), (2, 1)), ((2, 3), (2, 1)), ((2, 3), (0, 3)))

Draw = Callable[[int, int, int, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class PathGeometry:
  """The lengths of the scene, in scene units."""
  dash_length: float
  margin: float          # the pivot's offset beyond a dash's end and before the next one
  clearance: float       # the least centreline distance between dashes (not neighbours)
  continuity: float
  low: float             # every dash endpoint stays in [low, high]^2
  high: float
  seed_distance: float   # between the two target paths' seed ends
  tolerance: float       # most a balanced couple's two marker distances differ


def grow_targets(geometry: PathGeometry, draw: Draw, segments: np.ndarray, start: np.ndarray):
  """Grows two target paths per lane, one dash each in turn, from step `start[i]` on.

  `segments` `DTYPE` `[lanes, 2 x dashes, 4]` (slot 2k + p: dash k of path p; dashes >= 2;
  the slots from `start[i]` on are `FAR`) is filled in place. Step 0 seeds path A
  `seed_distance` inside the box, step 1 path B with its seed end `seed_distance` from A's;
  the last two steps are drawn together (the module docstring). Returns int64 `[lanes]`, the
  step at which a lane found no room (-1: grown whole), and int64 `[lanes]`, the couple chosen.
  """
  lanes, slots = segments.shape[:2]
  failed = np.full(lanes, -1)
  couples = np.zeros(lanes, np.int64)
  alive = np.zeros(lanes, bool)
  for step in range(int(start.min(initial=slots)), slots - 1):
    alive |= start == step
    rows = np.flatnonzero(alive)
    if not rows.size:
      continue
    obstacles = segments[rows, :step]
    if step == 0:
      inset = geometry.seed_distance
      propose = _in_box(geometry.low + inset, geometry.high - inset)
      placed, segment = _place_seed(geometry, propose, draw, step, rows, obstacles)
    elif step == 1:
      propose = _near(segments[rows, 0, :2], geometry.seed_distance)
      placed, segment = _place_seed(geometry, propose, draw, step, rows, obstacles)
    elif step < slots - 2:
      obstacles[:, step - 2] = FAR                     # the path's last dash, its neighbour
      placed, segment = _place_turn(geometry, draw, step, rows, segments[rows, step - 2],
                                    obstacles)
    else:
      placed, couple = _place_last_pair(geometry, draw, step, rows, segments)
      couples[rows] = couple
      segment = segments[rows, step]
    segments[rows[placed], step] = segment[placed]
    failed[rows[~placed]] = step
    alive[rows[~placed]] = False
  return failed, couples


def grow_path(geometry: PathGeometry, draw: Draw, segments: np.ndarray, rows: np.ndarray,
              first_slot: int, dashes: int) -> np.ndarray:
  """A path of `dashes` dashes seeded anywhere, in slots first_slot.. of `segments` for the
  lanes `rows` (clear of the slots before): bool `[rows]`, the lanes where it grew whole. A
  path that did not grow whole is taken out (its slots back to `FAR`). `segments` is updated."""
  alive = np.ones(rows.size, bool)
  for dash in range(dashes):
    slot = first_slot + dash
    lanes = rows[alive]
    if not lanes.size:
      break
    obstacles = segments[lanes, :slot]
    if dash == 0:
      propose = _in_box(geometry.low, geometry.high)
      placed, segment = _place_seed(geometry, propose, draw, dash, lanes, obstacles)
    else:
      obstacles[:, slot - 1] = FAR
      placed, segment = _place_turn(geometry, draw, dash, lanes, segments[lanes, slot - 1],
                                    obstacles)
    segments[lanes[placed], slot] = segment[placed]
    alive[np.flatnonzero(alive)[~placed]] = False
  segments[rows[~alive], first_slot:first_slot + dashes] = FAR
  return alive


def _in_box(low: float, high: float):
  """Seed spots uniform in [low, high]^2."""
  def propose(uniform, local):
    return low + (high - low) * uniform(0), low + (high - low) * uniform(1)
  return propose


def _near(points: np.ndarray, distance: float):
  """Seed spots `distance` from `points` `[l, 2]` in a uniform direction (`local` indexes
  `points`)."""
  def propose(uniform, local):
    angle = 2 * np.pi * uniform(0)
    return (points[local, 0] + distance * np.cos(angle),
            points[local, 1] + distance * np.sin(angle))
  return propose


def _place_seed(geometry: PathGeometry, propose, draw: Draw, step: int, rows: np.ndarray,
                obstacles: np.ndarray):
  """A seed dash per lane `rows`, with a uniform heading: the first of up to `SEED_TRIES`
  proposals that lies in the box and clear of `obstacles` `[l, m, 4]`: placed `[l]` and the
  segment `[l, 4]`."""
  lanes = rows.size
  segments = np.zeros((lanes, 4))
  placed = np.zeros(lanes, bool)
  todo = np.arange(lanes)
  for trial in range(SEED_TRIES):
    def uniform(slot, trial=trial, todo=todo):
      return draw(step, trial, slot, rows[todo])
    x, y = propose(uniform, todo)
    heading = 2 * np.pi * uniform(2)
    candidate = _dashes_from(x, y, np.cos(heading), np.sin(heading),
                             geometry.dash_length).astype(DTYPE)
    centre = (candidate[:, :2] + candidate[:, 2:]) / 2
    good = _free(candidate[:, None], centre, None, geometry.dash_length / 2, obstacles[todo],
                 geometry)[:, 0]
    segments[todo[good]] = candidate[good]
    placed[todo[good]] = True
    todo = todo[~good]
    if not todo.size:
      break
  return placed, segments


def _turn_candidates(geometry: PathGeometry, offset: np.ndarray, last: np.ndarray):
  """The candidate next dashes after `last` `[l, 4]`: segments `[l, K, 4]`, their weights
  `[l, K]` and the pivot `[l, 2]`, `last`'s unit heading `[l, 2]`. `offset` `[l]` in [0, 1)
  shifts the K evenly spread turns."""
  # Turn j is first + j x step; its cosine and sine (and those of 2 x continuity x turn, for
  # the weight cos^2(c t) = (1 + cos(2 c t)) / 2) come from the angle-sum identities.
  half = np.pi / (2 * geometry.continuity)
  step = 2 * half / TURN_CANDIDATES
  first = offset * step - half                                                 # [l]
  ladder = np.arange(TURN_CANDIDATES) * step
  cos_turn, sin_turn = _rotated(np.cos(first), np.sin(first), ladder)          # [l, K]
  double = 2 * geometry.continuity
  cos_double, _ = _rotated(np.cos(double * first), np.sin(double * first), double * ladder)
  heading = (last[:, 2:] - last[:, :2]) / geometry.dash_length                 # unit, [l, 2]
  pivot = last[:, 2:] + geometry.margin * heading
  cos_new = heading[:, 0, None] * cos_turn - heading[:, 1, None] * sin_turn    # rotate
  sin_new = heading[:, 0, None] * sin_turn + heading[:, 1, None] * cos_turn
  start_x = pivot[:, 0, None] + geometry.margin * cos_new
  start_y = pivot[:, 1, None] + geometry.margin * sin_new
  candidates = _dashes_from(start_x, start_y, cos_new, sin_new, geometry.dash_length)
  weights = np.maximum((1 + cos_double) / 2, 0.0)
  return candidates, weights, pivot, heading


def _rotated(cos_first: np.ndarray, sin_first: np.ndarray, angles: np.ndarray):
  """cos and sin `[l, K]` of first + angles, from first's `[l]` and the angles `[K]`."""
  cos_angles, sin_angles = np.cos(angles), np.sin(angles)
  return ((cos_first[:, None] * cos_angles - sin_first[:, None] * sin_angles).astype(DTYPE),
          (sin_first[:, None] * cos_angles + cos_first[:, None] * sin_angles).astype(DTYPE))


def _free_turns(geometry: PathGeometry, offset: np.ndarray, last: np.ndarray,
                obstacles: np.ndarray):
  """`_turn_candidates`, with the weights of those not in the box or not clear of
  `obstacles` `[l, m, 4]` set to 0: candidates `[l, K, 4]`, weights `[l, K]`."""
  candidates, weights, pivot, heading = _turn_candidates(geometry, offset, last)
  reach = geometry.margin + geometry.dash_length
  free = _free(candidates, pivot, heading, reach, obstacles, geometry)
  return candidates, np.where(free, weights, 0.0)


def _place_turn(geometry: PathGeometry, draw: Draw, step: int, rows: np.ndarray,
                last: np.ndarray, obstacles: np.ndarray):
  """The dash after `last` `[l, 4]` for the lanes `rows`, drawn among the free turns: placed
  `[l]` (False: no free turn) and the segment `[l, 4]`."""
  candidates, weights = _free_turns(geometry, draw(step, 0, 0, rows), last, obstacles)
  chosen, placed = _weighted_choice(weights, draw(step, 0, 1, rows))
  return placed, candidates[np.arange(rows.size), chosen]


def _place_last_pair(geometry: PathGeometry, draw: Draw, step: int, rows: np.ndarray,
                     segments: np.ndarray):
  """The target paths' last dashes (slots `step` and `step + 1`) for the lanes `rows`, drawn
  together among the free pairs of turns whose ends balance some couple; written into
  `segments`. Returns placed `[l]` and the couple `[l]` (drawn among the pair's balanced)."""
  count = TURN_CANDIDATES
  obstacles_a = segments[rows, :step + 1].copy()
  obstacles_a[:, step - 2] = FAR                       # A's neighbour; slot `step`: FAR
  obstacles_b = segments[rows, :step + 1].copy()
  obstacles_b[:, step - 1] = FAR                       # B's neighbour
  dashes_a, weights_a = _free_turns(geometry, draw(step, 0, 0, rows), segments[rows, step - 2],
                                    obstacles_a)
  dashes_b, weights_b = _free_turns(geometry, draw(step + 1, 0, 0, rows),
                                    segments[rows, step - 1], obstacles_b)
  # The four ends, each shaped to broadcast over [lanes, A's turn, B's turn].
  ends = (segments[rows, 0, None, None, :2], dashes_a[:, :, None, 2:],
          segments[rows, 1, None, None, :2], dashes_b[:, None, :, 2:])
  def distance(first, second):
    delta_x = ends[first][..., 0] - ends[second][..., 0]
    delta_y = ends[first][..., 1] - ends[second][..., 1]
    return np.sqrt(delta_x * delta_x + delta_y * delta_y)
  shape = (rows.size, count, count)
  balanced = np.stack([np.broadcast_to(np.abs(distance(*positive) - distance(*negative))
                                       <= geometry.tolerance, shape)
                       for positive, negative in COUPLES], axis=-1)            # [l, K, K, 4]
  weights = weights_a[:, :, None] * weights_b[:, None, :] * balanced.any(axis=-1)
  # The two new dashes must keep clear of each other. Each lies within 2 margin + dash_length
  # of its path's tip (the last dash's end), so only lanes with close tips are tested.
  reach = 2 * (2 * geometry.margin + geometry.dash_length) + geometry.clearance
  tip_gap = segments[rows, step - 2, 2:] - segments[rows, step - 1, 2:]
  close = np.flatnonzero(np.sum(tip_gap * tip_gap, axis=1) <= reach * reach)
  weights[close] *= _clear(dashes_a[close, :, None], dashes_b[close, None, :], geometry)
  pair, placed = _weighted_choice(weights.reshape(rows.size, -1), draw(step, 0, 1, rows))
  lanes = np.arange(rows.size)
  first, second = pair // count, pair % count
  segments[rows[placed], step] = dashes_a[lanes, first][placed]
  segments[rows[placed], step + 1] = dashes_b[lanes, second][placed]
  couple, _ = _weighted_choice(balanced[lanes, first, second].astype(np.float64),
                               draw(step, 0, 2, rows))
  return placed, couple


def _weighted_choice(weights: np.ndarray, uniform: np.ndarray):
  """Index `[l]` drawn with `weights` `[l, K]` (>= 0) by `uniform` `[l]`, and whether any
  weight was positive `[l]`."""
  cumulative = np.cumsum(weights, axis=1)
  total = cumulative[:, -1]
  chosen = np.sum(cumulative <= (uniform * total)[:, None], axis=1)
  return np.minimum(chosen, weights.shape[1] - 1), total > 0


def _dashes_from(start_x, start_y, cos, sin, length: float) -> np.ndarray:
  """Segments `[..., 4]` from their starts along the unit direction (cos, sin)."""
  return np.stack([start_x, start_y, start_x + length * cos, start_y + length * sin], axis=-1)


def _free(candidates: np.ndarray, centre: np.ndarray, heading, radius: float,
          obstacles: np.ndarray, geometry: PathGeometry) -> np.ndarray:
  """bool `[l, K]`: candidate `[l, K, 4]` lies in the box and clear of every obstacle
  `[l, m, 4]`. Every candidate of lane i lies within `radius` of `centre[i]` `[l, 2]` (and,
  if `heading` `[l, 2]` is given, on its side of the line through `centre` across it), so
  only the obstacles whose midpoints lie within radius + clearance + dash_length / 2 of it
  (and at most clearance + dash_length / 2 behind that line) are tested: a dash lies within
  half its length of its midpoint."""
  lanes, count = candidates.shape[:2]
  free = _inside(candidates, geometry)
  offset_x = (obstacles[..., 0] + obstacles[..., 2]) / 2 - centre[:, 0, None]     # [l, m]
  offset_y = (obstacles[..., 1] + obstacles[..., 3]) / 2 - centre[:, 1, None]
  slack = geometry.clearance + geometry.dash_length / 2
  near = offset_x * offset_x + offset_y * offset_y <= (radius + slack) ** 2
  if heading is not None:
    near &= offset_x * heading[:, 0, None] + offset_y * heading[:, 1, None] >= -slack
  lane, obstacle = np.nonzero(near)
  if lane.size:
    clear = _clear(candidates[lane], obstacles[lane, obstacle][:, None], geometry)
    index = lane[:, None] * count + np.arange(count)                             # [p, K]
    hits = np.bincount(index.reshape(-1), weights=(~clear).reshape(-1),
                       minlength=lanes * count)
    free &= hits.reshape(lanes, count) == 0
  return free


def _inside(segments: np.ndarray, geometry: PathGeometry) -> np.ndarray:
  """bool `[...]`: both endpoints of `segments` `[..., 4]` lie in [low, high]^2."""
  low, high = geometry.low, geometry.high
  inside = (segments[..., 0] >= low) & (segments[..., 0] <= high)
  for i in range(1, 4):
    inside &= (segments[..., i] >= low) & (segments[..., i] <= high)
  return inside


def _clear(first: np.ndarray, second: np.ndarray, geometry: PathGeometry) -> np.ndarray:
  """bool `[...]`: dashes `first` and `second` `[..., 4]` (broadcast) keep `clearance`
  between their centrelines. Two segments are that far apart iff no endpoint of one lies
  within `clearance` of the other and they do not cross; a crossing puts an endpoint within
  half a dash of the other dash, so it is tested only if clearance <= dash_length / 2."""
  a_x, a_y, b_x, b_y = (first[..., i] for i in range(4))
  c_x, c_y, d_x, d_y = (second[..., i] for i in range(4))
  near = geometry.clearance ** 2
  inverse = 1.0 / geometry.dash_length ** 2
  far = ((_point_dash2(a_x, a_y, c_x, c_y, d_x, d_y, inverse) >= near)
         & (_point_dash2(b_x, b_y, c_x, c_y, d_x, d_y, inverse) >= near)
         & (_point_dash2(c_x, c_y, a_x, a_y, b_x, b_y, inverse) >= near)
         & (_point_dash2(d_x, d_y, a_x, a_y, b_x, b_y, inverse) >= near))
  if geometry.clearance <= geometry.dash_length / 2:
    far &= ~((_side(a_x, a_y, b_x, b_y, c_x, c_y) * _side(a_x, a_y, b_x, b_y, d_x, d_y) < 0)
             & (_side(c_x, c_y, d_x, d_y, a_x, a_y) * _side(c_x, c_y, d_x, d_y, b_x, b_y) < 0))
  return far


def _point_dash2(p_x, p_y, s_x, s_y, e_x, e_y, inverse_length2: float):
  """Squared distance from point p to the dash s-e (broadcast), whose squared length is
  1 / inverse_length2."""
  v_x, v_y = e_x - s_x, e_y - s_y
  w_x, w_y = p_x - s_x, p_y - s_y
  along = np.clip((w_x * v_x + w_y * v_y) * inverse_length2, 0.0, 1.0)
  off_x, off_y = w_x - along * v_x, w_y - along * v_y
  return off_x * off_x + off_y * off_y


def _side(s_x, s_y, e_x, e_y, p_x, p_y):
  """The cross product (e - s) x (p - s): which side of line s-e the point p lies on."""
  return (e_x - s_x) * (p_y - s_y) - (e_y - s_y) * (p_x - s_x)

"""Far recurrences found by brute force: whether a target's (previous token, token) pair last
occurred more than a distance back in its row's stream."""

import numpy as np


def far_by_brute_force(inputs, targets, segment_ids, target_mask, min_distance: int):
  """`[rows, L]` bool over whole row streams: the target's pair last occurred > d back."""
  far = np.zeros(inputs.shape, bool)
  for r in range(inputs.shape[0]):
    for t in range(inputs.shape[1]):
      if not target_mask[r, t]:
        continue
      earlier = [s for s in range(t) if target_mask[r, s]
                 and segment_ids[r, s] == segment_ids[r, t]
                 and inputs[r, s] == inputs[r, t] and targets[r, s] == targets[r, t]]
      far[r, t] = bool(earlier) and t - max(earlier) > min_distance
  return far

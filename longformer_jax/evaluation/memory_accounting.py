"""What a memory actually holds, and what reading with it costs the host.

- `held_entries(state, batch)`: per row, the valid entries of every memory
  container in a model's state (`FifoMemory`, `MemoryEntries` and the
  variants' own caches all mark theirs with a `valid` array `[..., rows, n]`),
  summed over layers and containers: the entries the memory holds now, not
  its capacity. Expire-Span's expired entries are invalid, so its count is
  what the learnt spans keep.
- `state_bytes(state, batch)`: the bytes of the whole state per row (every
  array, capacity included): what carrying the memory costs, independent of
  how much was read.
- `PeakHostMemory`: the process's peak resident set over a stretch of work.
  On Linux the peak is reset at the start (`/proc/self/clear_refs`, value 5)
  and read from `VmHWM` at the end; elsewhere the lifetime peak of
  `resource.getrusage` is reported instead (it only grows).
"""

import resource
import sys

import jax
import numpy as np


def _valid_leaves(state) -> list:
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return [leaf for path, leaf in leaves
          if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == 'valid']


def held_entries(state, batch: int) -> np.ndarray:
  """int64 `[batch]`: valid entries per row, summed over layers and containers."""
  total = np.zeros([batch], np.int64)
  for valid in _valid_leaves(state):
    valid = np.asarray(valid)
    if valid.size == 0:
      continue
    rows = valid.shape[-2]
    if rows % batch:
      raise ValueError(f'a memory with {rows} rows does not split into {batch} batch rows')
    # [..., rows, n] with rows = batch * k (k > 1: one row per head, batch-major).
    per_row = np.moveaxis(valid, -2, 0).reshape(batch, -1)
    total += per_row.sum(axis=1)
  return total


def state_bytes(state, batch: int) -> int:
  """Bytes of every array of the state, per row."""
  return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(state)) // batch)


def _status_kib(field: str) -> int | None:
  try:
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1])
  except OSError:
    return None
  return None


class PeakHostMemory:
  """`with PeakHostMemory() as peak: ...` then `peak.bytes`, `peak.exact` (see module doc)."""

  def __enter__(self):
    self.exact = False
    if sys.platform.startswith('linux'):
      try:
        with open('/proc/self/clear_refs', 'w') as f:
          f.write('5')
        self.exact = True
      except OSError:
        pass
    return self

  def __exit__(self, *exc):
    peak = _status_kib('VmHWM') if self.exact else None
    if peak is None:
      self.exact = False
      peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      peak = peak // 1024 if sys.platform == 'darwin' else peak
    self.bytes = int(peak) * 1024
    return False

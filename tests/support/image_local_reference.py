"""The chunk inputs of the Image Transformer local attention tests: two rows, a document
boundary, padding, positions from START."""

import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.image_local import attention as image_local
from longformer_jax.attention.context import AttentionContext

B, D, H, HD = 2, 32, 2, 16
START = 24


def chunk_facts(n: int, boundary: int = 5, padding: int = 3):
  """Row 0: one document; row 1: a new document at `boundary` and its last slots padding."""
  positions = np.tile(np.arange(START, START + n, dtype=np.int32), (B, 1))
  segments = np.zeros((B, n), np.int32)
  segments[1, boundary:] = 1
  valid = np.ones((B, n), bool)
  valid[1, n - padding:] = False
  return positions, segments, valid


def section(**values) -> image_local.ImageLocalConfig:
  return image_local.ImageLocalConfig(**values)


def context_for(positions, segments, valid) -> AttentionContext:
  return AttentionContext(positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
                          reset=jnp.zeros((B,), bool), valid=jnp.asarray(valid))

"""What every attention variant is told about the chunk besides its features."""

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

# The Flax collection of a model's non-gradient state (e.g. the Routing
# Transformer's centroids): updated only when the caller makes it mutable and
# the context is not deterministic (training); kept in TrainState.model_state.
MODEL_STATE = 'model_state'


@flax.struct.dataclass
class AttentionContext:
  """Per-chunk context of the attention call contract (docs/design.md).

  Attributes:
    positions: `[batch, chunk]` int32 absolute positions in the row's stream.
    segment_ids: `[batch, chunk]` int32 document index along the stream; a
      query never attends to a key of another document.
    reset: `[batch]` bool, the row starts a new document at the chunk's first
      token: its memory is cleared before use.
    valid: `[batch, chunk]` bool, the token is real (not padding).
    global_flags: optional `[batch, chunk]` bool, global tokens (Longformer,
      BigBird).
    predicted: optional `[batch, chunk]` bool, the token is a target of the
      next-token loss (some query predicts it). Attendre with `hide_predicted`
      hides such keys from the queries before them, so that its delayed
      queries look ahead at the prompt only (train/delayed_targets.py).
    step: optional int32 scalar, the training step (set by the LM train step;
      None elsewhere). Performer redraws its random features by it.
    deterministic: static; True disables dropout.
  """
  positions: jax.Array
  segment_ids: jax.Array
  reset: jax.Array
  valid: jax.Array
  global_flags: Optional[jax.Array] = None
  predicted: Optional[jax.Array] = None
  step: Optional[jax.Array] = None
  deterministic: bool = flax.struct.field(pytree_node=False, default=True)

  def predicted_flags(self) -> jax.Array:
    """`predicted`, or all False where none is given (nothing hidden)."""
    return jnp.zeros_like(self.valid) if self.predicted is None else self.predicted

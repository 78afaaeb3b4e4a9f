"""The train state: everything a checkpoint holds besides the data position.

Memory is part of it (docs/design.md, contract 4): as in Transformer-XL, the
streams continue from one step to the next, so the memory a step leaves is
the memory the next step starts from.

`model_state` is the model's non-gradient state: the Flax collection
`model_state` (e.g. the Routing Transformer's k-means centroids, moved by a
moving average in every training chunk). Training threads it through the
chunks of a step and stores the last value; evaluation reads it. Empty
(`{}`) for models without such state, so older checkpoints still restore.
"""

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
  step: jax.Array        # int32 scalar: updates applied so far
  params: Any            # model parameters (float32)
  opt_state: Any         # optax state
  memory: Any            # tuple of per-layer memories, leaves [batch, ...]
  rng: jax.Array         # uint32[2] base key; step keys are fold_in(rng, step)
  model_state: Any = flax.struct.field(default_factory=dict)  # collection 'model_state'; {} if none

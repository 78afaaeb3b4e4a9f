"""From the data pipeline's `StreamBatch` to the arrays a step consumes."""

import numpy as np


def step_arrays(batch, pad_id: int) -> dict[str, np.ndarray]:
  """`[rows, T]` numpy arrays named as `longformer_jax.train.lm_objective` expects."""
  return dict(
      inputs=batch.inputs.astype(np.int32),
      targets=batch.targets.astype(np.int32),
      positions=batch.positions.astype(np.int32),
      segment_ids=batch.segment_ids.astype(np.int32),
      doc_start=batch.doc_start.astype(bool),
      input_mask=batch.inputs != pad_id,
      target_mask=batch.target_mask.astype(bool))

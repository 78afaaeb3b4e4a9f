"""`config.checkpoint`: the run's hold on its workdir (`checkpoint/workdir_lease.py`) and the
bound on every storage operation of a run (`checkpoint/storage_bound.py`).

The cadence and count of checkpoints stay in `config.train` (`checkpoint_every`,
`keep_checkpoints`, `async_checkpointing`), where the loop reads them.
"""

import dataclasses
import math

from longformer_jax.config.section import Section


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
  """The workdir lease (docs/training.md, "One run per workdir") and the storage bound
  (docs/training.md, "When the storage fails")."""
  # Seconds between two renewals of the lease (a background thread of process 0 renews it).
  lease_renew_s: float = 60.0
  # A lease not renewed for this many seconds is a dead run's, and the next run takes it over
  # (a run on the lease's own host takes it over at once when its process is gone). Hosts'
  # clocks must agree to well within this.
  lease_stale_s: float = 600.0
  # Seconds each storage operation of a run may take, from its start to its end, retries of
  # transient errors included: opening, listing and restoring the checkpoints, writing
  # config.json, uploading the metrics, and each checkpoint save including its background
  # writes (set it above the time a checkpoint of the model takes to write). Past it the run
  # ends with exit status 75, abandoning the operation.
  storage_timeout_s: float = 120.0

  def validate(self, env) -> None:
    del env
    self.require(self.lease_renew_s > 0, 'lease_renew_s', 'must be > 0 seconds')
    self.require(self.lease_stale_s >= 2 * self.lease_renew_s, 'lease_stale_s',
                 f'must be at least twice checkpoint.lease_renew_s = {self.lease_renew_s:g} '
                 f'(one late renewal must not make a live run look dead)')
    self.require(0 < self.storage_timeout_s < math.inf, 'storage_timeout_s',
                 'must be a finite number of seconds > 0')

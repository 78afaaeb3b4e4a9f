"""`config.parallel`: the device mesh, how logical axes map onto it, sequence parallelism."""

import dataclasses
from typing import Sequence

from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import Section

MESH_AXES = ('data', 'fsdp', 'tensor', 'sequence')
LOGICAL_AXES = ('batch', 'embed', 'heads', 'mlp', 'vocab', 'head_dim', 'length', 'memory',
                'layers')
SEQUENCE_PARALLEL_METHODS = ('all_gather', 'ring')


@dataclasses.dataclass(frozen=True)
class ParallelConfig(Section):
  """Mesh `(data, fsdp, tensor[, sequence])` (-1 fills the devices) and logical axis rules.

  `mesh_shape` has 3 sizes (the `sequence` axis is then 1) or 4. With a
  `sequence` axis > 1 a chunk's length is split over it
  (attention/sequence_parallel/attention.py, docs/scaling.md): `sequence_parallel`
  picks how attention sees the other devices' keys ('all_gather' or
  'ring'), and `load_balance` lays a causal chunk out in the zigzag order
  (device i holds slices i and 2n-1-i of 2n) so no device idles.
  """
  mesh_shape: tuple = (-1, 1, 1)
  multi_host: bool = False           # join the other processes (parallel/distributed.py)
  coordinator_address: str = ''      # 'host:port' of process 0; '' = from the environment
  num_processes: int = 0             # 0 = from the environment (TPU VM, SLURM, MPI)
  process_id: int = -1               # this process's rank; -1 = from the environment
  sequence_parallel: str = 'ring'    # all_gather | ring (used when the sequence axis > 1)
  load_balance: bool = True          # zigzag layout for causal attention over the sequence axis
  logical_axis_rules: tuple = (
      ('batch', ('data', 'fsdp')),
      # Parameters' `embed` over fsdp x sequence: the devices of a sequence axis share the
      # state as fsdp's do (MaxText's rule; docs/scaling.md, "Pod plans", measures it).
      # Activations' `embed` finds both taken by `batch` and `length` and stays whole.
      ('embed', ('fsdp', 'sequence')),
      ('heads', 'tensor'),
      ('mlp', 'tensor'),
      ('vocab', 'tensor'),
      ('head_dim', None),
      ('length', None),              # ('length', 'sequence') shards activations' length
      ('memory', None),
      ('layers', None),
  )

  def validate(self, env) -> None:
    del env
    shape = self.mesh_shape
    self.require(len(shape) in (3, 4) and all(isinstance(n, int) for n in shape),
                 'mesh_shape', f'must be 3 or 4 integers {MESH_AXES} (sequence defaults to 1)')
    self.require(all(n == -1 or n >= 1 for n in shape) and list(shape).count(-1) <= 1,
                 'mesh_shape', 'sizes must be >= 1, with at most one -1 (fill)')
    launch = {'coordinator_address': self.coordinator_address != '',
              'num_processes': self.num_processes != 0, 'process_id': self.process_id != -1}
    for key, is_set in launch.items():
      self.require(self.multi_host or not is_set, key, 'needs parallel.multi_host=True')
    self.require(self.num_processes >= 0, 'num_processes', 'must be >= 1 (0: from the environment)')
    self.require(self.process_id >= -1, 'process_id', 'must be >= 0 (-1: from the environment)')
    self.require(self.num_processes == 0 or self.process_id < self.num_processes, 'process_id',
                 f'must be below parallel.num_processes={self.num_processes}')
    self.require(launch['num_processes'] == launch['process_id'], 'process_id',
                 'parallel.num_processes and parallel.process_id are set together')
    self.require(self.sequence_parallel in SEQUENCE_PARALLEL_METHODS, 'sequence_parallel',
                 f'must be one of {SEQUENCE_PARALLEL_METHODS}')
    for rule in self.logical_axis_rules:
      self.require(len(rule) == 2 and rule[0] in LOGICAL_AXES, 'logical_axis_rules',
                   f'has a bad rule {rule!r}: (logical axis in {LOGICAL_AXES}, mesh axes)')
      targets = rule[1] if isinstance(rule[1], tuple) else (rule[1],)
      self.require(all(t is None or t in MESH_AXES for t in targets), 'logical_axis_rules',
                   f'has a bad rule {rule!r}: mesh axes must be in {MESH_AXES} or None')


def length_on_sequence(rules: Sequence) -> tuple:
  """`rules` with the logical `length` axis mapped to the `sequence` mesh axis.

  The default rules keep `length` unsharded; a model run with a sequence
  axis > 1 shards its `[batch, length, ...]` activations with these.
  """
  return tuple(('length', 'sequence') if name == 'length' else (name, axes)
               for name, axes in rules)


def check_sequence_split(chunk_lengths: Sequence[int], sequence_size: int,
                         load_balance: bool) -> None:
  """Every chunk length splits evenly over the sequence axis (2x it with load balancing).

  Raises `ConfigError` naming `parallel.mesh_shape` (the sequence size does
  not divide a chunk) or `parallel.load_balance` (only the zigzag's 2n
  slices do not).
  """
  for length in chunk_lengths:
    if length % sequence_size:
      raise ConfigError('parallel.mesh_shape',
                        f'a sequence axis of {sequence_size} cannot split chunks of {length} '
                        f'tokens (chunk lengths {tuple(chunk_lengths)})')
    if load_balance and sequence_size > 1 and length % (2 * sequence_size):
      raise ConfigError('parallel.load_balance',
                        f'True needs chunk lengths divisible by 2 x the sequence axis '
                        f'({2 * sequence_size}); {length} is not (set it False or change '
                        f'the chunk length)')

"""`config.parallel`: the device mesh and how logical axes map onto it."""

import dataclasses

from longformer_jax.config.section import Section

MESH_AXES = ('data', 'fsdp', 'tensor')
LOGICAL_AXES = ('batch', 'embed', 'heads', 'mlp', 'vocab', 'head_dim', 'length', 'memory',
                'layers')


@dataclasses.dataclass(frozen=True)
class ParallelConfig(Section):
  """Mesh `(data, fsdp, tensor)` (-1 fills the devices) and logical axis rules."""
  mesh_shape: tuple = (-1, 1, 1)
  multi_host: bool = False           # call jax.distributed.initialize()
  logical_axis_rules: tuple = (
      ('batch', ('data', 'fsdp')),
      ('embed', 'fsdp'),
      ('heads', 'tensor'),
      ('mlp', 'tensor'),
      ('vocab', 'tensor'),
      ('head_dim', None),
      ('length', None),
      ('memory', None),
      ('layers', None),
  )

  def validate(self, env) -> None:
    del env
    shape = self.mesh_shape
    self.require(len(shape) == len(MESH_AXES) and all(isinstance(n, int) for n in shape),
                 'mesh_shape', f'must be {len(MESH_AXES)} integers {MESH_AXES}')
    self.require(all(n == -1 or n >= 1 for n in shape) and list(shape).count(-1) <= 1,
                 'mesh_shape', 'sizes must be >= 1, with at most one -1 (fill)')
    for rule in self.logical_axis_rules:
      self.require(len(rule) == 2 and rule[0] in LOGICAL_AXES, 'logical_axis_rules',
                   f'has a bad rule {rule!r}: (logical axis in {LOGICAL_AXES}, mesh axes)')
      targets = rule[1] if isinstance(rule[1], tuple) else (rule[1],)
      self.require(all(t is None or t in MESH_AXES for t in targets), 'logical_axis_rules',
                   f'has a bad rule {rule!r}: mesh axes must be in {MESH_AXES} or None')

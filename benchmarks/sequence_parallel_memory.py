"""Per-device memory of sequence-parallel attention as the sequence axis grows.

  python benchmarks/sequence_parallel_memory.py [--length 4096] [--heads 8] [--head_dim 64]

For a fixed chunk length, each method ('all_gather', 'ring') and sequence
axis size n = 1, 2, 4, 8 (fake CPU devices: the script sets
`--xla_force_host_platform_device_count=8` unless XLA_FLAGS is set) it
compiles, never runs, causal attention with load balancing
(`attention/sequence_parallel/attention.sequence_parallel_attention`, batch 1) on a
mesh `sequence n` with the inputs split along the length, forward alone and forward + backward (the gradient with
respect to q, k, v), and prints XLA's `memory_analysis()` temporaries per
device in MiB, with the arguments' bytes per device. The dense logits of one
device are `[heads, length / n, length]` for all-gather and
`[heads, length / n, length / n]` per ring step.
"""

import argparse
import os
import sys

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=wrong-import-position

from longformer_jax.parallel.mesh import make_mesh  # pylint: disable=wrong-import-position
from longformer_jax.attention.sequence_parallel.attention import (  # pylint: disable=wrong-import-position
    METHODS, sequence_parallel_attention)

SEQUENCE_SIZES = (1, 2, 4, 8)
MIB = 2 ** 20


def compiled_memory(method: str, size: int, length: int, heads: int, head_dim: int,
                    backward: bool):
  """XLA's memory analysis of the compiled attention on a mesh `sequence size`."""
  mesh = make_mesh((1, 1, 1, size), jax.devices()[:size])
  split = NamedSharding(mesh, PartitionSpec(None, 'sequence'))   # inputs arrive split
  tokens = jax.ShapeDtypeStruct((1, length), jnp.int32, sharding=split)
  arrays = jax.ShapeDtypeStruct((1, length, heads, head_dim), jnp.float32, sharding=split)

  def attention(q, k, v, positions, segment_ids, valid):
    return sequence_parallel_attention(q, k, v, positions, segment_ids, valid, mesh=mesh,
                                       causal=True, method=method, load_balance=size > 1)

  def forward_backward(q, k, v, positions, segment_ids, valid):
    loss = lambda q, k, v: jnp.sum(attention(q, k, v, positions, segment_ids, valid))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  fn = forward_backward if backward else attention
  lowered = jax.jit(fn).lower(arrays, arrays, arrays, tokens, tokens,
                              jax.ShapeDtypeStruct((1, length), jnp.bool_, sharding=split))
  return lowered.compile().memory_analysis()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--length', type=int, default=4096)
  parser.add_argument('--heads', type=int, default=8)
  parser.add_argument('--head_dim', type=int, default=64)
  args = parser.parse_args()
  print(f'causal attention, batch 1, length {args.length}, {args.heads} heads of '
        f'{args.head_dim}, float32, load balancing for n > 1; per-device MiB '
        f'({jax.default_backend()}, jax {jax.__version__})\n')
  print('| method | sequence n | arguments | fwd temp | fwd+bwd temp |')
  print('|---|---:|---:|---:|---:|')
  for method in METHODS:
    for size in SEQUENCE_SIZES:
      forward = compiled_memory(method, size, args.length, args.heads, args.head_dim, False)
      both = compiled_memory(method, size, args.length, args.heads, args.head_dim, True)
      print(f'| {method} | {size} | {forward.argument_size_in_bytes / MIB:.2f} | '
            f'{forward.temp_size_in_bytes / MIB:.2f} | {both.temp_size_in_bytes / MIB:.2f} |',
            flush=True)


if __name__ == '__main__':
  main()

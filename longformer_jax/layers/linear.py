"""Dense projections whose kernels carry logical axis names.

Every weight matrix of the model is created here, so that its logical axes
(`embed`, `heads`, `head_dim`, `mlp`, `vocab`) are declared in one place and
the config's rules map them to mesh axes (see `longformer_jax/parallel`).

The kernel is initialised at its full shape (`[*in_features, *out_features]`)
with fan-in scaling over all input dims. (Flax's `DenseGeneral` initialises a
flattened kernel and reshapes it, which clashes with logical-axis constraints
of the full rank.)
"""

from typing import Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp


def kernel_init(num_in: int, num_out: int):
  """Fan-in scaled truncated normal over all `num_in` input dims."""
  return nn.initializers.variance_scaling(
      1.0, 'fan_in', 'truncated_normal', in_axis=tuple(range(num_in)),
      out_axis=tuple(range(num_in, num_in + num_out)))


class ProjectionKernel(nn.Module):
  """Only the kernel of a `Projection` (same name, init and axes), as an array.

  For code that applies the projection inside `jax.lax` control flow (a
  branch cannot create parameters): `ProjectionKernel(..., name='key')()`
  creates `key/kernel` exactly as `projection(..., name='key')` would.
  """
  in_shape: tuple
  features: tuple
  kernel_axes: tuple

  @nn.compact
  def __call__(self) -> jax.Array:
    init = kernel_init(len(self.in_shape), len(self.features))
    return self.param('kernel', nn.with_logical_partitioning(init, self.kernel_axes),
                      (*self.in_shape, *self.features), jnp.float32)


class Projection(nn.Module):
  """Contracts `x`'s trailing `num_in` axes with a kernel `[*in, *features]`."""
  features: tuple
  kernel_axes: tuple
  num_in: int = 1
  use_bias: bool = False
  bias_axes: tuple = ()
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    in_shape = x.shape[x.ndim - self.num_in:]
    init = kernel_init(self.num_in, len(self.features))
    kernel = self.param('kernel', nn.with_logical_partitioning(init, self.kernel_axes),
                        (*in_shape, *self.features), jnp.float32)
    in_dims = tuple(range(x.ndim - self.num_in, x.ndim))
    y = jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype),
                            ((in_dims, tuple(range(self.num_in))), ((), ())))
    if self.use_bias:
      bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                             self.bias_axes),
                        self.features, jnp.float32)
      y = y + bias.astype(self.dtype)
    return y


def projection(features: Union[int, Sequence[int]], *, kernel_axes: Sequence[str], name: str,
               dtype=jnp.float32, num_in: int = 1, use_bias: bool = False,
               bias_axes: Sequence[str] = ()) -> Projection:
  """A projection with float32 parameters and a logically named kernel.

  Args:
    features: output feature shape, e.g. `(num_heads, head_dim)`.
    kernel_axes: logical names of the kernel's dims, inputs then outputs,
      e.g. `('embed', 'heads', 'head_dim')`.
    name: the parameter scope name.
    dtype: computation dtype (parameters stay float32).
    num_in: how many trailing input axes are contracted.
    use_bias: whether to add a bias (named by `bias_axes`).
  """
  features = (features,) if isinstance(features, int) else tuple(features)
  return Projection(features, tuple(kernel_axes), num_in, use_bias, tuple(bias_axes), dtype,
                    name=name)

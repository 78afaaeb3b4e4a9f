"""AdamW with linear warmup, cosine decay and global-norm clipping (optax)."""

import jax
import ml_collections
import optax

from longformer_jax.train.tied_parameters import tie_parameters


def learning_rate_schedule(config: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, cosine to `peak * end_learning_rate_fraction` at `num_steps`."""
  peak = config.learning_rate
  warmup = min(config.warmup_steps, max(num_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(num_steps, warmup + 1),
      end_value=peak * config.end_learning_rate_fraction)


def decay_mask(params):
  """Weight decay on matrices (kernels, embeddings), not on biases or norms."""
  return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: ml_collections.ConfigDict, num_steps: int) -> optax.GradientTransformation:
  """`config` is `config.optimizer`."""
  tied = [tie_parameters(config.tied_parameters)] if config.tied_parameters else []
  return optax.chain(
      *tied,
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.adamw(learning_rate_schedule(config, num_steps), b1=config.b1, b2=config.b2,
                  eps=config.eps, weight_decay=config.weight_decay, mask=decay_mask))

"""The phased training schedule of Longformer (Beltagy et al., 2020, sec. 4.2).

"We start with a short sequence length and window size, then on each
subsequent phase we double the window size and the sequence length, and halve
the learning rate." Here phase p (0-based) of `train.phases` runs
`train.phase_steps[p]` steps (default: `train.num_steps` split evenly) with

  chunk_len = data.chunk_len * phase_length_factor ** p
  window    = window * phase_window_factor ** p   (model.longformer.window and
              model.layer_schedule.longformer.window)
  lr        = (the run's warmup-cosine schedule) * phase_lr_factor ** p

(defaults 2, 2, 0.5). Changing the chunk length or window changes shapes, so
each phase compiles its own step and memory (which starts empty: the memory
of the previous phase has the old shapes). The data streams continue from the
same stream position: they are read in units of phase 0's step, a phase-p
step being `phase_length_factor ** p` consecutive units
(`data/phased_streams.py`). `train.phases = 1` (default) is the plain
single-phase run.
"""

import dataclasses

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from longformer_jax.train.train_config import int_list

# The Longformer window, and its per-layer schedule, grow with the phases.
WINDOW_SECTION, WINDOW_KEY = 'longformer', 'window'


@dataclasses.dataclass(frozen=True)
class Phase:
  index: int
  start_step: int      # first step of the phase (inclusive)
  end_step: int        # exclusive
  chunk_len: int
  length_multiple: int  # phase_length_factor ** index: data units per step
  window_multiple: int
  lr_scale: float


def training_phases(config: ml_collections.ConfigDict) -> list[Phase]:
  """The phases of a validated `config` (one phase covering the run when `train.phases` is 1).

  `TrainConfig.validate` (train/train_config.py) has checked the phase settings.
  """
  train = config.train
  count = train.phases
  steps = int_list(train.phase_steps) or [train.num_steps // count] * count
  length_factor, window_factor = train.phase_length_factor, train.phase_window_factor
  lr_factor = train.phase_lr_factor
  bounds = np.cumsum([0] + steps)
  return [Phase(index=p, start_step=int(bounds[p]), end_step=int(bounds[p + 1]),
                chunk_len=config.data.chunk_len * length_factor ** p,
                length_multiple=length_factor ** p, window_multiple=window_factor ** p,
                lr_scale=lr_factor ** p)
          for p in range(count)]


def phase_of_step(phases: list[Phase], step: int) -> Phase:
  """The phase that runs step `step` (0-based); steps past the end belong to the last phase."""
  for phase in phases:
    if step < phase.end_step:
      return phase
  return phases[-1]


def phase_of_state(phases: list[Phase], step: int) -> Phase:
  """The phase whose shapes a state saved after `step` updates has (the phase of its last step)."""
  return phase_of_step(phases, max(step - 1, 0))


def scale_window(value, multiple: int):
  """`value` (an int, a comma string or a tuple of per-layer ints) times `multiple`, same type."""
  if isinstance(value, (int, np.integer)):
    return int(value) * multiple
  if isinstance(value, str):
    return ','.join(str(int(item) * multiple) for item in value.split(','))
  return tuple(int(item) * multiple for item in value)


def phase_model_config(model: ml_collections.ConfigDict, phase: Phase) -> ml_collections.ConfigDict:
  """`config.model` with the window (and its per-layer schedule) scaled for `phase`."""
  model = ml_collections.ConfigDict(model.to_dict())
  if phase.window_multiple == 1:
    return model
  section = model[WINDOW_SECTION]
  section[WINDOW_KEY] = scale_window(section[WINDOW_KEY], phase.window_multiple)
  scheduled = (model.layer_schedule or {}).get(WINDOW_SECTION, {})
  if WINDOW_KEY in scheduled:
    scheduled[WINDOW_KEY] = scale_window(scheduled[WINDOW_KEY], phase.window_multiple)
  return model


def phase_lr_scale(phases: list[Phase]) -> optax.Schedule:
  """step -> the learning-rate multiplier of the step's phase (jit-friendly)."""
  ends = np.array([phase.end_step for phase in phases[:-1]], np.int32)
  scales = np.array([phase.lr_scale for phase in phases], np.float32)

  def schedule(step):
    return jnp.asarray(scales)[jnp.searchsorted(jnp.asarray(ends), step, side='right')]
  return schedule


def phased_learning_rate(base: optax.Schedule, phases: list[Phase]) -> optax.Schedule:
  """The learning rate actually applied: `base(step) * phase_lr_scale(step)`."""
  scale = phase_lr_scale(phases)
  return lambda step: base(step) * scale(step)


def phased_optimizer(optimizer: optax.GradientTransformation,
                     phases: list[Phase]) -> optax.GradientTransformation:
  """`optimizer` whose updates are scaled by the phase's learning-rate multiplier.

  AdamW's update is `-lr * (adam + wd * p)`, so scaling the update scales the
  learning rate (weight decay included, as in AdamW with a smaller lr).
  """
  if len(phases) == 1:
    return optimizer
  return optax.chain(optimizer, optax.scale_by_schedule(phase_lr_scale(phases)))

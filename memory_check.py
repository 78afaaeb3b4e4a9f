"""Ahead-of-time memory check: per-device bytes of a config's train step, nothing allocated.

  python memory_check.py --config=configs/NAME.py [--config.KEY=VALUE ...] [--vocab_size=N]

Builds the train state's shapes and shardings with `jax.eval_shape`
(`longformer_jax/train/initialization.abstract_train_state`), jits the train
step exactly as training does (`longformer_jax/tasks/lm_training.py`: the same in/out shardings, donation
and activation sharding rules, on the config's mesh), lowers it with
abstract arguments and compiles it, without running it or creating the
state. XLA's `memory_analysis()` of the compiled per-device program gives
the bytes of its arguments (state and batch), outputs, temporaries
(activations, gradients, workspace) and generated code; `total` is
arguments + outputs - aliased (donated state reused for the new state) +
temporaries + code, an estimate of the peak per device.

Run it on the machine (or with as many fake devices,
`XLA_FLAGS=--xla_force_host_platform_device_count=N`) the mesh is meant for.
Task 'lm' (every phase of a phased run); a bad setting prints one line.
"""

import dataclasses
import functools
from typing import Any

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import flags
import jax
import ml_collections

from longformer_jax import command_line
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.evaluation.eval_config import EvalConfig
from longformer_jax.experiment_config import chunk_lengths, validate_config, validate_mesh
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh, mesh_axis_sizes
from longformer_jax.parallel.parallel_config import check_sequence_split
from longformer_jax.tasks.registry import readers, task_for
from longformer_jax.train import initialization, phases as phasing, steps
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from longformer_jax.train.train_config import TrainConfig

FIELDS = ('argument', 'output', 'alias', 'temp', 'generated_code', 'total')


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """Per-device bytes of one compiled train step (one training phase)."""
  phase: int
  chunk_len: int
  argument: int
  output: int
  alias: int
  temp: int
  generated_code: int

  @property
  def total(self) -> int:
    return self.argument + self.output - self.alias + self.temp + self.generated_code


def check_mesh(config: ml_collections.ConfigDict, device_count: int) -> dict:
  """The mesh's axis sizes; raises `ConfigError` if the mesh or the split sizes do not fit."""
  sizes = mesh_axis_sizes(config.parallel.mesh_shape, device_count)
  without_sequence = ml_collections.ConfigDict(config.to_dict())
  without_sequence.parallel.mesh_shape = (sizes['data'], sizes['fsdp'], sizes['tensor'])
  validate_mesh(without_sequence, device_count // sizes['sequence'])
  lengths = chunk_lengths(config.task, DataConfig.build(config.data.to_dict(), 'data'),
                          TrainConfig.build(config.train.to_dict(), 'train'),
                          EvalConfig.build(config.eval.to_dict(), 'eval'))
  check_sequence_split(lengths, sizes['sequence'],
                       config.parallel.load_balance and config.model.causal)
  return sizes


def _abstract_batch(batch_size: int, length: int, batch_sharding) -> dict:
  """The shapes, dtypes and sharding of a train batch (`longformer_jax/train/steps.step_arrays`)."""
  int_array = jax.ShapeDtypeStruct((batch_size, length), 'int32', sharding=batch_sharding)
  bool_array = jax.ShapeDtypeStruct((batch_size, length), 'bool', sharding=batch_sharding)
  return dict(inputs=int_array, targets=int_array, positions=int_array, segment_ids=int_array,
              doc_start=bool_array, input_mask=bool_array, target_mask=bool_array)


@dataclasses.dataclass(frozen=True)
class PhaseStep:
  """One training phase's train step, jitted as training jits it, and its abstract arguments.

  `step.lower(state, batch).compile()` compiles it."""
  phase: int
  chunk_len: int
  step: Any
  state: Any                      # the abstract train state (shapes, dtypes, shardings)
  batch: dict                     # the abstract batch (`_abstract_batch`)


def phase_steps(config: ml_collections.ConfigDict, devices=None,
                vocab_size: int = 0) -> tuple[jax.sharding.Mesh, list[PhaseStep]]:
  """The mesh and each phase's jitted train step of the checked `config`; nothing allocated.

  Args:
    config: a complete experiment config (`validate_config`), task 'lm'.
    devices: the mesh's devices (default: all).
    vocab_size: the tokenizer's vocabulary size; 0 loads the config's tokenizer to read it
      (a plan for a machine that has the tokenizer's file when this one does not gives it).
  """
  streamed = ' or '.join(repr(name) for name in readers('carries_memory'))
  require(task_for(config.task).carries_memory, 'task',
          f'{config.task!r}: the memory check compiles the train step of task {streamed} only')
  require(vocab_size >= 0, '--vocab_size', 'must be >= 0 (0: the tokenizer\'s)')
  devices = list(jax.devices() if devices is None else devices)
  check_mesh(config, len(devices))
  mesh = make_mesh(config.parallel.mesh_shape, devices)
  rules = config.parallel.logical_axis_rules
  batch_sharding = sharding.batch_sharding(mesh, rules)
  vocab_size = vocab_size or make_tokenizer(config.data).vocab_size
  phases = phasing.training_phases(config)
  num_steps = config.train.num_steps
  optimizer = phasing.phased_optimizer(make_optimizer(config.optimizer, num_steps), phases)
  learning_rate_fn = phasing.phased_learning_rate(
      learning_rate_schedule(config.optimizer, num_steps), phases)
  batch_size = config.data.batch_size
  result = []
  for phase in phases:
    model = DecoderLM(lm_model_config(phasing.phase_model_config(config.model, phase),
                                      vocab_size))
    abstract_state, state_shardings = initialization.abstract_train_state(
        model, optimizer, config.seed, batch_size, phase.chunk_len, mesh, rules)
    step = jax.jit(
        functools.partial(steps.train_step, model=model, optimizer=optimizer,
                          learning_rate_fn=learning_rate_fn, chunk_len=phase.chunk_len,
                          grad_accum_steps=config.optimizer.grad_accum_steps),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, sharding.replicated(mesh)),
        donate_argnums=0)
    length = phase.chunk_len * config.data.chunks_per_step
    result.append(PhaseStep(phase=phase.index, chunk_len=phase.chunk_len, step=step,
                            state=abstract_state,
                            batch=_abstract_batch(batch_size, length, batch_sharding)))
  return mesh, result


def compile_step(config: ml_collections.ConfigDict, mesh, phase_step: PhaseStep):
  """`phase_step`'s train step lowered and compiled in the config's activation sharding."""
  with sharding.activation_sharding(mesh, config.parallel.logical_axis_rules, config.parallel):
    return phase_step.step.lower(phase_step.state, phase_step.batch).compile()


def step_memory(phase_step: PhaseStep, compiled) -> StepMemory:
  """XLA's per-device bytes of `phase_step`'s `compiled` program."""
  analysis = compiled.memory_analysis()
  return StepMemory(
      phase=phase_step.phase, chunk_len=phase_step.chunk_len,
      argument=int(analysis.argument_size_in_bytes),
      output=int(analysis.output_size_in_bytes),
      alias=int(analysis.alias_size_in_bytes),
      temp=int(analysis.temp_size_in_bytes),
      generated_code=int(analysis.generated_code_size_in_bytes))


def train_step_memory(config: ml_collections.ConfigDict, devices=None,
                      vocab_size: int = 0) -> list[StepMemory]:
  """Compiles (never runs) each phase's train step of the checked `config`; its memory per device.

  Args: as `phase_steps`.
  """
  mesh, steps_of_phases = phase_steps(config, devices, vocab_size)
  return [step_memory(phase_step, compile_step(config, mesh, phase_step))
          for phase_step in steps_of_phases]


def _mib(num_bytes: int) -> str:
  return f'{num_bytes / 2**20:,.2f} MiB'


def format_report(config: ml_collections.ConfigDict, device_count: int,
                  reports: list[StepMemory]) -> str:
  """A table of per-device bytes, one row per phase."""
  sizes = mesh_axis_sizes(config.parallel.mesh_shape, device_count)
  mesh = ' x '.join(f'{name} {size}' for name, size in sizes.items())
  lines = [f'train step memory per device ({jax.default_backend()}, {device_count} devices: '
           f'{mesh}; batch {config.data.batch_size})',
           f'{"phase":>5} {"chunk":>6} ' + ' '.join(f'{name:>16}' for name in FIELDS)]
  for report in reports:
    values = [getattr(report, name) for name in FIELDS]
    lines.append(f'{report.phase:>5} {report.chunk_len:>6} ' +
                 ' '.join(f'{_mib(value):>16}' for value in values))
  lines.append('bytes: ' + '; '.join(
      f'phase {r.phase}: ' + ', '.join(f'{name} {getattr(r, name)}' for name in FIELDS)
      for r in reports))
  return '\n'.join(lines)


def main(argv) -> None:
  if len(argv) > 1:
    raise ConfigError('--config', f'unexpected arguments: {argv[1:]}')
  config = validate_config(command_line.flag_config())
  reports = train_step_memory(config, vocab_size=flags.FLAGS.vocab_size)
  print(format_report(config, jax.device_count(), reports))


def define_flags() -> None:
  flags.DEFINE_string('config', command_line.DEFAULT_CONFIG,
                      'Experiment config file (configs/NAME.py).')
  flags.DEFINE_integer('vocab_size', 0,
                       "The tokenizer's vocabulary size, given instead of loading the config's "
                       'tokenizer (for a plan whose tokenizer file is on another machine); '
                       "0: the tokenizer's.")
  flags.DEFINE_bool('debug', False, 'Show the traceback of configuration errors.')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)

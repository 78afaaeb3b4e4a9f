"""The training loop's side of the language-model task (tasks/lm.py): streams, memory, phases.

Rows of the batch are endless streams of documents (`TrainStreams`); the
memory (Transformer-XL cache, kNN memory, ...) is part of the train state
and carried from step to step. `train.phases > 1` trains in phases of
growing chunk length and window and shrinking learning rate (Longformer,
sec. 4.2; `train/phases.py`): each phase has its own model config, state
layout, compiled step and evaluator, built up front as abstract shapes; a
phase's memory starts empty. The data position saved with a checkpoint is
the streams' position (plus the phase of a phased run).
"""

import dataclasses
import functools

from absl import logging
import jax
import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import collisions
from longformer_jax.data.corpus import (byte_answer_masks, cut_into_pieces, curriculum_documents,
                                        load_corpus, tokenize_answered_documents,
                                        tokenize_documents)
from longformer_jax.data.curriculum_streams import CurriculumStreams, require_steps_after
from longformer_jax.data.phased_streams import PhasedStreams
from longformer_jax.data.train_streams import TrainStreams
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.evaluation.lm_evaluator import Evaluator
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import ResolvedModel, lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization, phases as phasing, steps
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer


@dataclasses.dataclass(frozen=True)
class PhaseRun:
  """One training phase's model, state layout, jitted train step, evaluator and memory."""
  phase: phasing.Phase
  model_config: ResolvedModel
  abstract_state: object
  state_shardings: object
  train_step: object
  evaluator: Evaluator
  fresh_memory: object


class LanguageModelTraining:
  """Next-token prediction on streams (a `loop.TrainingTask`); `task` is tasks/lm.py's."""

  def __init__(self, task, config: ml_collections.ConfigDict):
    self.unit = task.unit
    self.task = task
    self.config = config
    self.phases = phasing.training_phases(config)
    self.phased = len(self.phases) > 1
    self.tokenizer = make_tokenizer(config.data)
    skip = config.data.skip_undecodable
    self.valid_docs = tokenize_documents(self.tokenizer, load_corpus(config.data, 'valid'), skip)
    # Streams are read in units of phase 0's step; a phase-p step is several units.
    tokens_per_unit = config.data.chunk_len * config.data.chunks_per_step
    def streams_of(documents):
      answer_starts = answer_masks = hidden_answer = None
      if config.data.corpus == 'collisions':
        # Many answers per episode, each read as HIDDEN_ANSWER (data/collisions.py).
        docs, answer_masks = byte_answer_masks(self.tokenizer, documents)
        hidden_answer = collisions.HIDDEN_ANSWER
      elif config.data.loss_on == 'answer':     # the loss counts the answers alone
        docs, answer_starts = tokenize_answered_documents(self.tokenizer, documents)
      else:
        docs = cut_into_pieces(tokenize_documents(self.tokenizer, documents, skip),
                               config.data.batch_size)
      return TrainStreams(docs, config.data.batch_size, tokens_per_unit, config.seed,
                          self.tokenizer.bos_id, jax.process_index(), jax.process_count(),
                          answer_starts, answer_masks, hidden_answer,
                          count_answers_only=config.data.loss_on == 'answer')
    unit_streams = streams_of(load_corpus(config.data, 'train'))
    if config.data.passkey_curriculum_steps:      # short passkey documents first
      require_steps_after('data.passkey_curriculum_steps', config.data.passkey_curriculum_steps,
                          config.train.num_steps, 'train.num_steps', 'the long documents')
      unit_streams = CurriculumStreams(streams_of(curriculum_documents(config.data)),
                                       unit_streams, config.data.passkey_curriculum_steps)
    self.streams = PhasedStreams(unit_streams)
    num_steps = config.train.num_steps
    self.optimizer = phasing.phased_optimizer(make_optimizer(config.optimizer, num_steps),
                                              self.phases)
    self.learning_rate_fn = phasing.phased_learning_rate(
        learning_rate_schedule(config.optimizer, num_steps), self.phases)
    self.mesh = make_mesh(config.parallel.mesh_shape)
    self.rules = config.parallel.logical_axis_rules
    self.batch_sharding = sharding.batch_sharding(self.mesh, self.rules)
    # Built up front (abstract shapes only); each phase compiles when it starts.
    self.runs = [self._build_phase(phase) for phase in self.phases]
    self.run = self.runs[0]
    self.description = describe_model(self.run.model_config)
    self._compiled_step = None
    self._next_batch = None

  def _build_phase(self, phase: phasing.Phase) -> PhaseRun:
    config = self.config
    model_config = lm_model_config(phasing.phase_model_config(config.model, phase),
                                   self.tokenizer.vocab_size)
    model = DecoderLM(model_config)
    abstract_state, state_shardings = initialization.abstract_train_state(
        model, self.optimizer, config.seed, config.data.batch_size, phase.chunk_len, self.mesh,
        self.rules)
    train_step = jax.jit(
        functools.partial(steps.train_step, model=model, optimizer=self.optimizer,
                          learning_rate_fn=self.learning_rate_fn, chunk_len=phase.chunk_len,
                          grad_accum_steps=config.optimizer.grad_accum_steps),
        in_shardings=(state_shardings, self.batch_sharding),
        out_shardings=(state_shardings, sharding.replicated(self.mesh)),
        donate_argnums=0)
    evaluator = Evaluator(model_config, self.tokenizer, batch_size=config.data.eval_batch_size,
                          chunk_len=phase.chunk_len, mesh=self.mesh, rules=self.rules,
                          param_shardings=state_shardings.params)
    fresh_memory = jax.jit(lambda: DecoderLM.init_state(model_config, config.data.batch_size),
                           out_shardings=state_shardings.memory)
    return PhaseRun(phase, model_config, abstract_state, state_shardings, train_step, evaluator,
                    fresh_memory)

  # ---- state and data position ---------------------------------------------

  def abstract_state(self, step: int):
    """A checkpoint holds the memory of the phase that ran its last step."""
    self.run = self.runs[phasing.phase_of_state(self.phases, step).index]
    return self.run.abstract_state

  def fresh_state(self):
    state, _ = initialization.sharded_train_state(
        DecoderLM(self.run.model_config), self.optimizer, self.config.seed,
        self.config.data.batch_size, self.run.phase.chunk_len, self.mesh, self.rules)
    return state

  def state_with_params(self, params):
    state, _ = initialization.train_state_with_params(
        DecoderLM(self.run.model_config), self.optimizer, self.config.seed,
        self.config.data.batch_size, self.run.phase.chunk_len, self.mesh, self.rules, params,
        abstract=(self.run.abstract_state, self.run.state_shardings))
    return state

  def data_state(self) -> dict:
    data_state = self.streams.state()
    if self.phased:
      data_state['phase'] = self.run.phase.index
    return data_state

  def restore_data(self, data_state: dict, step: int) -> None:
    self.run = self.runs[phasing.phase_of_state(self.phases, step).index]
    if self.phased and data_state.get('phase') != self.run.phase.index:
      raise ConfigError('train.phase_steps',
                        f'checkpoint {step} records phase {data_state.get("phase")}, but the '
                        f'phase settings put it in phase {self.run.phase.index}; resume with the '
                        f'settings it was trained with')
    self.streams.restore(data_state)

  # ---- steps -------------------------------------------------------------------

  def starts_segment(self, step: int) -> bool:
    return any(phase.start_step == step for phase in self.phases[1:])

  def enter_segment(self, state, step: int):
    """Switches to the phase of `step` (fresh memory of its shapes) and compiles its step."""
    phase = phasing.phase_of_step(self.phases, step)
    if phase.index != self.run.phase.index:
      # A new phase: longer chunks and window, new shapes; memory starts empty.
      self.run = self.runs[phase.index]
      state = state.replace(memory=self.run.fresh_memory())
      self.description = describe_model(self.run.model_config)
      logging.info('Phase %d from step %d: chunk_len %d, window x%d, lr x%g; %s', phase.index,
                   step, phase.chunk_len, phase.window_multiple, phase.lr_scale, self.description)
    self._next_batch = self._load_batch()
    self._compiled_step = self.run.train_step.lower(state, self._next_batch).compile()
    return state

  def _load_batch(self) -> dict:
    arrays = steps.step_arrays(self.streams.next_batch(self.run.phase.length_multiple),
                         self.tokenizer.pad_id)
    return sharding.to_global_batch(arrays, self.batch_sharding)

  def train_step(self, state):
    batch = self._next_batch if self._next_batch is not None else self._load_batch()
    self._next_batch = None
    state, metrics = self._compiled_step(state, batch)
    tokens = self.run.phase.chunk_len * self.config.data.chunks_per_step
    return state, metrics, tokens * self.config.data.batch_size

  def host_metrics(self, device_metrics) -> dict:
    metrics = self.task.metrics(jax.tree_util.tree_map(float, jax.device_get(device_metrics)))
    if self.phased:
      metrics['phase'] = self.run.phase.index
    return metrics

  def evaluate(self, state) -> dict:
    return self.run.evaluator.evaluate(state.params, self.valid_docs,
                                       self.config.train.eval_max_tokens,
                                       model_state=state.model_state)

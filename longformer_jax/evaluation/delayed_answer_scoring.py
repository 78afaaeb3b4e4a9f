"""Scoring an answer causally behind a prompt read with delayed queries (Attendre's Q memory).

A model whose layers delay their queries (`models/attendre_delay.py`, total
delay D = sum of the layers' `q_memory_size`) answers the query at position p
only once D later inputs have been pushed, and a bidirectional one
(`causal=False`) lets that query see their keys. Teacher forcing in chunks
(`passkey_scoring.PasskeyScorer`) would then let an answer position see the
answer tokens after it. Here the prompt is read with its delay ("wait to
attend") and the answer causally:

With input positions p (input[p] = BOS or token p - 1, target[p] = token p)
and a = the document's `answer_start` (the first answer target):

1. the prompt, inputs [0, a), is read from the BOS in chunks of C
   (`chunk_len`), then its last a mod C inputs in steps of the powers of two
   that sum to them, largest first (100 = 64 + 32 + 4: at most log2(C) steps,
   and a batch compiles at most log2(C) + 2 step lengths);
2. every answer input a + k (k = 0 .. answer_len - 1; input a is the last
   prompt token, input a + k the answer token k - 1, teacher forced) is pushed
   alone: S_{a+k} = S_{a+k-1} + input a + k, never flushed;
3. the prediction at a + k: S_{a+k} followed by D padding tokens (one flush
   step, `attendre_delay.padding_context`: nothing valid, so no key is added
   and no valid memory entry displaced); its last output slot, D - 1, is the
   stream position a + k. The flushed state is discarded. With D = 0 it is the
   output of the push itself.

So the query of an answer position has read inputs [0, a + k] and nothing
after them, and every earlier position's query has waited as it would in a
stream (the prompt's delayed queries see later prompt keys). The answer's inputs
(a + 1 on) are flagged `predicted`: a model trained with
`attendre.hide_predicted` hides them from the prompt's queries, as in training;
other models ignore the flag.

Rows with different answer starts: one row per document, all from position 0,
in lockstep: each step has one length for the batch, and a row that has no
step of that length (its prompt ended, or has no such power of two in its
remainder) sits the step out: its state is kept as it was (`keep_rows`, a
per-row select over every state leaf, per-head memory rows included). No row
is padded, so each row's memory sees exactly its own schedule above.

Cost per answer token: one 1-token step and one D-token flush step (the
model over D padding positions with the memory), on top of reading the
prompt; `tokens` counts the inputs the push steps read (rows x step lengths),
not the flushes, and `seconds` includes them.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.evaluation import memory_accounting
from longformer_jax.evaluation.passkey_scoring import document_batch
from longformer_jax.models.attendre_delay import padding_context, total_delay
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.parallel import sharding
from longformer_jax.train import initialization
from longformer_jax.train.delayed_targets import predicted_inputs
from longformer_jax.train.lm_objective import chunk_context


def prompt_steps(prompt_inputs: int, chunk_len: int) -> list[int]:
  """Lengths of the steps that read `prompt_inputs` inputs: whole chunks, then the
  remainder's powers of two, largest first (e.g. 21 inputs, chunk 8: [8, 8, 4, 1])."""
  whole, rest = divmod(prompt_inputs, chunk_len)
  return [chunk_len] * whole + [1 << b for b in range(rest.bit_length() - 1, -1, -1)
                                if rest >> b & 1]


def lockstep_rounds(prompts: list[int], chunk_len: int) -> list[tuple[int, np.ndarray]]:
  """`[(length, active [rows] bool)]`: the prompt steps of every row (`prompt_steps`), in
  rounds of one length: first the whole chunks, then each power of two, largest first."""
  rounds = []
  for i in range(max([n // chunk_len for n in prompts], default=0)):
    rounds.append((chunk_len, np.asarray([n // chunk_len > i for n in prompts])))
  for bit in range(chunk_len.bit_length(), -1, -1):
    active = np.asarray([(n % chunk_len) >> bit & 1 == 1 for n in prompts])
    if (1 << bit) < chunk_len and active.any():
      rounds.append((1 << bit, active))
  return rounds


def keep_rows(active: jax.Array, new, old):
  """`new` where `active [batch]`, else `old`, leaf by leaf; a leaf with batch * k rows
  (per-head memories: row b * k + h) repeats each row's flag k times."""
  def pick(n, o):
    rows = jnp.repeat(active, n.shape[0] // active.shape[0])
    return jnp.where(rows.reshape(rows.shape + (1,) * (n.ndim - 1)), n, o)
  return jax.tree_util.tree_map(pick, new, old)


def _slot_scores(logits: jax.Array, targets: jax.Array, log_probs: bool) -> dict:
  """`logits [batch, vocab]`, `targets [batch]` -> `{'correct' [batch] bool, 'nll' [batch]}`
  (with `log_probs`, also `'log_probs' [batch, vocab]`)."""
  logits = logits.astype(jnp.float32)
  scores = {'correct': jnp.argmax(logits, axis=-1) == targets,
            'nll': optax.softmax_cross_entropy_with_integer_labels(logits, targets)}
  if log_probs:
    scores['log_probs'] = jax.nn.log_softmax(logits, axis=-1)
  return scores


def push_step(params, memory, chunk: dict, model_state, *, model: DecoderLM,
              log_probs: bool = False):
  """Pushes `chunk` (`[batch, L]` arrays of `document_batch`, plus `active [batch, 1]`) for
  the active rows: `(memory, scores of the last slot against its target)`."""
  variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}
  logits, pushed, _ = model.apply(variables, chunk['inputs'], memory,
                                  chunk_context(chunk, deterministic=True))
  memory = keep_rows(chunk['active'][:, 0], pushed, memory)
  return memory, _slot_scores(logits[:, -1], chunk['targets'][:, -1], log_probs)


def flush_step(params, memory, chunk: dict, model_state, *, model: DecoderLM, delay: int,
               pad_id: int, log_probs: bool = False):
  """D padding tokens after each row's last input (`chunk['positions'] [batch, 1]`): the
  scores of output slot D - 1 (that input's position) against `chunk['targets'] [batch, 1]`.
  The flushed memory is dropped."""
  variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}
  last = AttentionContext(positions=chunk['positions'], segment_ids=chunk['segment_ids'],
                          reset=jnp.zeros(chunk['positions'].shape[:1], bool),
                          valid=jnp.ones(chunk['positions'].shape, bool))
  ctx = padding_context(last, delay)
  tokens = jnp.full(ctx.positions.shape, pad_id, jnp.int32)
  logits, _, _ = model.apply(variables, tokens, memory, ctx)
  return _slot_scores(logits[:, delay - 1], chunk['targets'][:, 0], log_probs)


def _take(arrays: dict, starts: np.ndarray, length: int, active: np.ndarray) -> dict:
  """`[rows, length]` windows of `arrays` from per-row `starts` (clipped), and `active`."""
  width = arrays['inputs'].shape[1]
  index = np.minimum(starts[:, None] + np.arange(length)[None], width - 1)
  keys = ('inputs', 'targets', 'positions', 'segment_ids', 'doc_start', 'input_mask',
          'predicted')
  window = {k: np.take_along_axis(arrays[k], index, axis=1) for k in keys}
  window['active'] = active[:, None]
  return window


class DelayedAnswerScorer:
  """Scores documents with one delayed-query model (module docstring); the interface of
  `passkey_scoring.PasskeyScorer` (`score`), compiled once per step length. With
  `log_probs`, `score` also returns each answer position's log-probabilities."""

  def __init__(self, model_config, *, batch_size: int, chunk_len: int, mesh, rules,
               param_shardings, log_probs: bool = False):
    self.model_config, self.batch_size, self.chunk_len = model_config, batch_size, chunk_len
    self.mesh, self.rules = mesh, rules
    self.delay, self.log_probs = total_delay(model_config), log_probs
    self._batch_sharding = sharding.batch_sharding(mesh, rules)
    memory_shardings = initialization.memory_shardings(model_config, batch_size, mesh, rules)
    replicated = sharding.replicated(mesh)
    model = DecoderLM(model_config)
    self._push = jax.jit(functools.partial(push_step, model=model, log_probs=log_probs),
                         in_shardings=(param_shardings, memory_shardings, self._batch_sharding,
                                       replicated),
                         out_shardings=(memory_shardings, replicated), donate_argnums=1)
    self._flush_at = functools.partial(flush_step, model=model, delay=self.delay,
                                       log_probs=log_probs)
    self._flush = {}                          # pad id -> the jitted flush
    self._in_shardings = (param_shardings, memory_shardings, self._batch_sharding, replicated)
    self._fresh_memory = jax.jit(lambda: DecoderLM.init_state(model_config, batch_size),
                                 out_shardings=memory_shardings)
    self._warm = set()                        # step lengths compiled ('flush': the flush)

  def _global(self, window: dict) -> dict:
    return sharding.to_global_batch(window, self._batch_sharding)

  def _flush_fn(self, pad_id: int):
    if pad_id not in self._flush:
      self._flush[pad_id] = jax.jit(functools.partial(self._flush_at, pad_id=pad_id),
                                    in_shardings=self._in_shardings,
                                    out_shardings=sharding.replicated(self.mesh))
    return self._flush[pad_id]

  def _warm_up(self, params, model_state, arrays: dict, lengths: set, pad_id: int) -> None:
    """Compiles the push for each new step length (and the flush) with no row active,
    off the clock."""
    rows = np.zeros(self.batch_size, bool)
    starts = np.zeros(self.batch_size, np.int64)
    for length in sorted(lengths - self._warm):
      out = self._push(params, self._fresh_memory(), self._global(
          _take(arrays, starts, length, rows)), model_state)
      jax.block_until_ready(out)
      self._warm.add(length)
    if self.delay and ('flush', pad_id) not in self._warm:
      jax.block_until_ready(self._flush_fn(pad_id)(params, self._fresh_memory(), self._global(
          _take(arrays, starts, 1, rows)), model_state))
      self._warm.add(('flush', pad_id))

  def _score_group(self, params, model_state, group: list, bos_id: int, pad_id: int):
    """One batch of rows: per-row lists of per-answer-token (correct, nll), the final memory
    (each row's S after its last answer input), the seconds and the inputs pushed."""
    arrays = document_batch(group, self.batch_size, self.chunk_len, bos_id, pad_id)
    arrays['predicted'] = np.asarray(predicted_inputs(arrays['answer_mask']))
    rows = group + [group[0]] * (self.batch_size - len(group))
    starts = np.asarray([d.answer_start for d in rows], np.int64)       # a per row
    lengths = np.asarray([d.answer_len if i < len(group) else 0 for i, d in enumerate(rows)])
    rounds = lockstep_rounds([int(a) for a in starts], self.chunk_len)
    self._warm_up(params, model_state, arrays, {n for n, _ in rounds} | {1}, pad_id)
    tokens = {key: [[] for _ in group] for key in ('correct', 'nll', 'log_probs')}
    began = time.perf_counter()
    memory, read = self._fresh_memory(), np.zeros(self.batch_size, np.int64)
    for length, active in rounds:                                       # the prompts
      memory, _ = self._push(params, memory, self._global(_take(arrays, read, length, active)),
                             model_state)
      read += length * active
    pushed = sum(length for length, _ in rounds) + int(lengths.max(initial=0))
    for k in range(int(lengths.max(initial=0))):                        # the answers
      active = k < lengths
      window = _take(arrays, starts + k, 1, active)
      memory, scores = self._push(params, memory, self._global(window), model_state)
      if self.delay:
        scores = self._flush_fn(pad_id)(params, memory, self._global(window), model_state)
      scores = {key: np.asarray(value) for key, value in scores.items()}
      for i in np.flatnonzero(active[:len(group)]):
        for key, value in scores.items():
          tokens[key][i].append(value[i])
    jax.block_until_ready(memory)
    seconds = time.perf_counter() - began
    return tokens, memory, seconds, pushed * self.batch_size

  def score(self, params, documents: list, bos_id: int, pad_id: int, model_state=None) -> dict:
    """Per document, numpy `[len(documents)]`: `correct` (answer tokens whose argmax is right)
    and `nll` (their summed nats), `entries` (held after the last answer input, before its
    flush), `seconds` and `tokens` (the group's wall time and pushed inputs, divided among
    its rows); `token_correct` / `token_nll`, per document an array `[answer_len]` (with
    `log_probs`, `token_log_probs` `[answer_len, vocab]`); `state_bytes`: the memory's bytes
    per row."""
    per_token = ('token_correct', 'token_nll', 'token_log_probs')
    totals = {key: [] for key in ('correct', 'nll', 'entries', 'seconds', 'tokens') + per_token}
    state_bytes = 0
    with sharding.activation_sharding(self.mesh, self.rules):
      for start in range(0, len(documents), self.batch_size):
        group = documents[start:start + self.batch_size]
        tokens, memory, seconds, pushed = self._score_group(params, model_state or {}, group,
                                                            bos_id, pad_id)
        state_bytes = memory_accounting.state_bytes(memory, self.batch_size)
        held = memory_accounting.held_entries(memory, self.batch_size)
        for i in range(len(group)):
          for key in ('correct', 'nll', 'log_probs'):
            totals['token_' + key].append(np.asarray(tokens[key][i]))
          totals['correct'].append(int(totals['token_correct'][-1].sum()))
          totals['nll'].append(float(totals['token_nll'][-1].sum()))
          totals['entries'].append(int(held[i]))
          totals['seconds'].append(seconds / len(group))
          totals['tokens'].append(pushed / len(group))
    scores = {k: (v if k in per_token else np.asarray(v)) for k, v in totals.items()}
    if not self.log_probs:
      del scores['token_log_probs']
    scores['state_bytes'] = state_bytes
    return scores

"""Scoring passkey documents chunk by chunk with one model and its memory.

`PasskeyScorer.score` reads each document from its BOS, one row per document,
in chunks of `chunk_len` with the memory carried and nothing else (the memory
starts empty), teacher-forced, and returns per document the answer tokens
whose argmax is right and their negative log-likelihood (`answer_step`), the
entries the memory holds after the chunk that ends the document (`memory_accounting.held_entries`)
and, per group of rows, the seconds spent reading (compilation excluded: the
step is compiled and run once on a blank chunk before the clock starts).
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from longformer_jax.attention.context import MODEL_STATE
from longformer_jax.evaluation import memory_accounting, trained_memory
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.parallel import sharding
from longformer_jax.train import initialization
from longformer_jax.train.lm_objective import chunk_context


def document_batch(documents: list, num_rows: int, chunk_len: int, bos_id: int,
                   pad_id: int) -> dict:
  """`[num_rows, n * chunk_len]` teacher-forcing arrays of `documents` (one per row, from
  position 0; padded at the end), and `answer_mask` on the answer's targets. Rows past
  `len(documents)` repeat the first document with no answer."""
  longest = max([d.tokens.size for d in documents], default=chunk_len)
  width = -(-longest // chunk_len) * chunk_len
  inputs = np.full([num_rows, width], pad_id, np.int32)
  targets = np.full([num_rows, width], pad_id, np.int32)
  answer_mask = np.zeros([num_rows, width], bool)
  needle = np.full([num_rows, 2, width], -2, np.int32)    # [first, end) input positions, per row
  for row in range(num_rows):
    if not documents:           # a blank batch: BOS then padding (compiles the step)
      inputs[row, 0] = bos_id
      continue
    document = documents[row] if row < len(documents) else documents[0]
    length = document.tokens.size
    inputs[row, 0], inputs[row, 1:length] = bos_id, document.tokens[:-1]
    targets[row, :length] = document.tokens
    if row < len(documents):
      answer_mask[row, document.answer_start:document.answer_start + document.answer_len] = True
      needle[row, 0] = document.needle_start + 1          # inputs are shifted by the BOS
      needle[row, 1] = document.needle_start + 1 + document.needle_len
  positions = np.tile(np.arange(width, dtype=np.int32), (num_rows, 1))
  return dict(inputs=inputs, targets=targets, positions=positions,
              segment_ids=np.zeros_like(inputs), doc_start=positions == 0,
              input_mask=inputs != pad_id, answer_mask=answer_mask,
              needle_span=np.moveaxis(needle, 1, 2))


def _retrieved_positions(intermediates) -> list:
  """The `knn_retrieved` arrays `[b, c, h, k]` that Memorizing layers sowed (one per layer)."""
  leaves = jax.tree_util.tree_flatten_with_path(intermediates)[0]
  return [leaf for path, leaf in leaves
          if any(getattr(key, 'key', None) == 'knn_retrieved' for key in path)]


def answer_step(params, memory, chunk: dict, model_state, *, model: DecoderLM,
                with_intermediates: bool = False):
  """One chunk: `(memory, {'correct', 'nll', 'needle_retrieved', 'needle_share'})`, per row
  `[batch]`: answer tokens whose argmax is the target, their summed negative log-likelihood
  (nats), answer tokens whose query retrieved (any kNN layer, any head, among its top-k) an
  entry of the needle sentence, and the sum over answer tokens of the needle's share of what
  the query retrieved, in its best kNN layer and head (valid retrieved entries that are the
  needle's / valid retrieved entries; 0 for a model without a kNN layer). With
  `with_intermediates`, also `'intermediates'`: what the layers sowed (e.g. Attendre's
  `attendre_scored`, its memory as the policy scored it before evicting)."""
  variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}
  (logits, memory, _), sown = model.apply(variables, chunk['inputs'], memory,
                                          chunk_context(chunk, deterministic=True),
                                          mutable=['intermediates'])
  answer = chunk['answer_mask']
  hits = (jnp.argmax(logits, axis=-1) == chunk['targets']) & answer
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                        chunk['targets'])
  first, end = chunk['needle_span'][:, 0, 0], chunk['needle_span'][:, 0, 1]
  found = jnp.zeros(answer.shape, bool)
  share = jnp.zeros(answer.shape, jnp.float32)
  for retrieved in _retrieved_positions(sown.get('intermediates', {})):   # one per kNN layer
    in_needle = (retrieved >= first[:, None, None, None]) & (retrieved < end[:, None, None, None])
    found |= jnp.any(in_needle, axis=(2, 3))
    held = jnp.maximum(jnp.sum(retrieved >= 0, axis=3), 1)                 # [b, c, h]
    share = jnp.maximum(share, jnp.max(jnp.sum(in_needle, axis=3) / held, axis=2))
  out = {'correct': jnp.sum(hits, axis=1).astype(jnp.int32),
         'nll': jnp.sum(jnp.where(answer, nll, 0.0), axis=1),
         'needle_retrieved': jnp.sum(found & answer, axis=1).astype(jnp.int32),
         'needle_share': jnp.sum(jnp.where(answer, share, 0.0), axis=1)}
  if with_intermediates:
    out['intermediates'] = sown.get('intermediates', {})
  return memory, out


class PasskeyScorer:
  """Scores documents with one eval-time model, chunk by chunk (compiled once per model)."""

  def __init__(self, model_config, *, batch_size: int, chunk_len: int, mesh, rules,
               param_shardings):
    self.model_config, self.batch_size, self.chunk_len = model_config, batch_size, chunk_len
    self.mesh, self.rules = mesh, rules
    self._batch_sharding = sharding.batch_sharding(mesh, rules)
    memory_shardings = initialization.memory_shardings(model_config, batch_size, mesh, rules)
    replicated = sharding.replicated(mesh)
    self._step = jax.jit(functools.partial(answer_step, model=DecoderLM(model_config)),
                         in_shardings=(param_shardings, memory_shardings, self._batch_sharding,
                                       replicated),
                         out_shardings=(memory_shardings, replicated), donate_argnums=1)
    self._fresh_memory = jax.jit(lambda: DecoderLM.init_state(model_config, batch_size),
                                 out_shardings=memory_shardings)
    self._warm = False

  def _warm_up(self, params, model_state, bos_id: int, pad_id: int) -> None:
    """Compiles the step and the fresh memory (one blank chunk), off the clock."""
    if self._warm:
      return
    blank = {k: np.asarray(v) for k, v in document_batch(
        [], self.batch_size, self.chunk_len, bos_id, pad_id).items()}
    chunk = sharding.to_global_batch(blank, self._batch_sharding)
    memory, out = self._step(params, self._fresh_memory(), chunk, model_state or {})
    jax.block_until_ready((memory, out))
    self._warm = True

  def score(self, params, documents: list, bos_id: int, pad_id: int, model_state=None) -> dict:
    """Per document, numpy `[len(documents)]`: `correct` and `nll` (see `answer_step`) and
    `entries` (held after the document); per document too, `seconds`: the wall time of its
    group of rows divided among the group, and `tokens`: the tokens the group's step read
    (rows x chunks x chunk) divided the same way; `state_bytes`: the memory's bytes per row."""
    totals = {'correct': [], 'nll': [], 'needle_retrieved': [], 'needle_share': [],
              'entries': [], 'seconds': [], 'tokens': []}
    state_bytes = 0
    with sharding.activation_sharding(self.mesh, self.rules):
      self._warm_up(params, model_state, bos_id, pad_id)
      for start in range(0, len(documents), self.batch_size):
        group = documents[start:start + self.batch_size]
        arrays = document_batch(group, self.batch_size, self.chunk_len, bos_id, pad_id)
        began = time.perf_counter()
        memory = self._fresh_memory()
        sums = {'correct': np.zeros(self.batch_size, np.int64), 'nll': np.zeros(self.batch_size),
                'needle_retrieved': np.zeros(self.batch_size, np.int64),
                'needle_share': np.zeros(self.batch_size)}
        # Each row's memory is counted after the chunk that holds its document's last token.
        last_chunk = (np.asarray([d.tokens.size for d in group]) - 1) // self.chunk_len
        entries = np.zeros(self.batch_size, np.int64)
        for index, begin in enumerate(range(0, arrays['inputs'].shape[1], self.chunk_len)):
          chunk = {k: v[:, begin:begin + self.chunk_len] for k, v in arrays.items()}
          chunk = sharding.to_global_batch(chunk, self._batch_sharding)
          memory, out = self._step(params, memory, chunk, model_state or {})
          for key in sums:
            sums[key] = sums[key] + np.asarray(out[key])
          ending = np.flatnonzero(last_chunk == index)
          if ending.size:
            entries[ending] = memory_accounting.held_entries(memory, self.batch_size)[ending]
        seconds = time.perf_counter() - began
        state_bytes = memory_accounting.state_bytes(memory, self.batch_size)
        for key in sums:
          totals[key].append(sums[key][:len(group)])
        totals['entries'].append(entries[:len(group)])
        totals['seconds'].append(np.full(len(group), seconds / len(group)))
        totals['tokens'].append(np.full(len(group), arrays['inputs'].size / len(group)))
    scores = {key: np.concatenate(parts) for key, parts in totals.items()}
    scores['state_bytes'] = state_bytes
    if trained_memory.memory_kind(self.model_config) != 'memorizing':   # no kNN layer
      del scores['needle_retrieved'], scores['needle_share']
    return scores


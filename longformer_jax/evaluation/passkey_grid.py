"""Passkey retrieval over a grid of document lengths and key depths, for each eval-time memory.

A model trained on short passkey documents (`data.corpus='passkey'`,
configs/passkey.py) reads longer ones chunk by chunk with a memory chosen at
evaluation time, and must repeat the key at the end. `eval.passkey_grid` is
one string in the style of `eval.memory_sweep`:

  'lengths=256,512,1024,2048;depths=0,25,50,75,100;documents=8;memories=none,xl,sinks,attendre_lra_max;memory_size=256'

Settings (`;` separates them, `,` the values of one):

- `lengths`: document lengths in tokens; or `max_length=N`: 256, 512, ...
  doubling up to N (default 4096). Each length must hold the needle and the
  question (105 bytes with the byte tokenizer).
- `depths`: needle depths in percent of the filler (default 0,25,50,75,100).
- `documents`: documents per cell (default 4); `seed` (default 0): document
  i of cell (length, depth) is `data/passkey.seeded_document(seed, length,
  depth, i)`, the same for every memory.
- `memories` (default none): each `NAME` or `NAME:SIZE` (SIZE overrides
  `memory_size`, default 256), built by memory_sweep.model_overrides, so the
  checkpoint of a model trained without memory loads unchanged:
    none               no memory, each chunk alone (vanilla, mem_len 0)
    xl                 a FIFO cache of SIZE hidden states (vanilla, mem_len SIZE; Transformer-XL)
    sinks              StreamingLLM: 4 sink tokens + a window of chunk + SIZE - 4
    attendre_<policy>  Attendre's K/V memory of SIZE entries with an eviction policy of
                       memory/policies.py (fifo, lru, lfu, lra, lra_last, lra_max, lra_sum, lfa,
                       sink); no Q memory (see below)
    knn                Memorizing Transformer's kNN memory of SIZE entries (FIFO, joint gate)
- `chunk`: the evaluation chunk (default `eval.chunk_len`, else the training one).
- any other key is a setting of the memories' sections (memory_sweep's
  extra keys, e.g. `rope_max_distance=511`, `top_k=32`, `lfa_gamma=0.9`),
  applied to the memories that read it.

An Attendre Q memory (`q_memory_size > 0`) is not offered: its delayed
queries see the tokens after the one they predict, here the next digits of
the key (memory_sweep refuses it for language models for the same reason).

Scoring: teacher forcing, [BOS] + document[:-1] in, the document as targets,
chunk by chunk with the memory carried and nothing else (the memory starts
empty at BOS). A document counts as retrieved when the argmax of every answer
token (the key's 5 digits with the byte tokenizer) is the key's token; with
the true prefix, argmax equals greedy decoding of the digits. Each cell also
reports `digit_accuracy` (answer tokens right) and `digit_loss` (nats per
answer token).

Output (`write_grid`): `passkey_grid.json` with the axes, one entry per
memory and one cell per (memory, length, depth); and `passkey_grid_<memory>.png`
per memory: rows are depths (0% at the top), columns lengths (shortest at
the left), colour the accuracy (evaluation/heatmap_png.py: red 0, yellow
0.5, green 1; colour bar below).
"""

import dataclasses
import functools
import glob
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from longformer_jax.attention.core.context import MODEL_STATE
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.config.section import closest_name
from longformer_jax.data import passkey
from longformer_jax.evaluation import memory_sweep
from longformer_jax.evaluation.heatmap_png import write_heatmap
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.report_files import fresh_output_dir
from longformer_jax.memory import policies
from longformer_jax.models.decoder_lm import DecoderLM, lm_model_config
from longformer_jax.models.model_config import resolve_model
from longformer_jax.parallel import sharding
from longformer_jax.train import initialization
from longformer_jax.train.lm_objective import chunk_context

GRID_KEY = 'eval.passkey_grid'
GRID_SETTINGS = ('lengths', 'max_length', 'depths', 'documents', 'seed', 'memories',
                 'memory_size', 'chunk')
FIRST_LENGTH = 256
# Memory name -> (sweep variant, policy); 'attendre_<policy>' names are added below.
MEMORY_KINDS = {'none': ('vanilla', 'fifo'), 'xl': ('vanilla', 'fifo'),
                'sinks': ('streaming_sinks', 'sink'), 'knn': ('memorizing', 'fifo')}
MEMORY_KINDS.update({f'attendre_{p}': ('attendre', p) for p in policies.POLICY_CHOICES})
AXES = {'rows': 'depth of the needle in percent of the filler (0: first); heat map: top to bottom',
        'columns': 'document length in tokens; heat map: left to right',
        'colour': 'accuracy (all answer tokens right): red 0, yellow 0.5, green 1; '
                  'the bar below the map runs 0 (left) to 1 (right)'}


@dataclasses.dataclass(frozen=True)
class GridMemory:
  """One memory of the grid: its label and the memory-sweep point that builds it."""
  label: str                     # 'none', 'xl:256', 'attendre_lra_max:256'
  point: memory_sweep.SweepPoint

  def describe(self) -> dict:
    described = dict(memory=self.label, **self.point.describe())
    del described['q_memory_size']
    return described


@dataclasses.dataclass(frozen=True)
class PasskeyGrid:
  lengths: tuple
  depths: tuple                  # percent
  documents: int
  seed: int
  chunk: int
  memories: tuple                # GridMemory


def _ints(settings: dict, key: str, default: list) -> list:
  items = settings.pop(key, None)
  if items is None:
    return default
  try:
    return [int(item) for item in items]
  except ValueError:
    raise ConfigError(GRID_KEY, f'{key} must be integers, got {items}') from None


def _memory(item: str, size: int, chunk: int, extras: dict) -> GridMemory:
  name, _, given = item.partition(':')
  require(name in MEMORY_KINDS, GRID_KEY, f'unknown memory {name!r}; choose from '
          f'{", ".join(MEMORY_KINDS)}{closest_name(name, tuple(MEMORY_KINDS))}')
  if given:
    require(given.isdigit(), GRID_KEY, f'memory {item!r}: the size after ":" must be an integer')
    size = int(given)
  variant, policy = MEMORY_KINDS[name]
  size = 0 if name == 'none' else size
  require(name == 'none' or size > 0, GRID_KEY, f'memory {item!r} needs a size > 0')
  extra = tuple((key, value if memory_sweep.reads(variant, policy, key) else memory_sweep.NOT_READ)
                for key, value in sorted(extras.items()))
  label = name if name == 'none' else f'{name}:{size}'
  return GridMemory(label, memory_sweep.SweepPoint(variant, policy, size, 0, chunk, extra))


def parse_grid(spec: str, default_chunk: int) -> PasskeyGrid:
  """The grid of `spec` (module docstring); ConfigError naming eval.passkey_grid."""
  try:
    settings = memory_sweep.parse_settings(spec)
  except ConfigError as error:
    raise ConfigError(GRID_KEY, error.message) from None
  for key in ('documents', 'seed', 'memory_size', 'chunk', 'max_length'):
    require(len(settings.get(key, [''])) == 1, GRID_KEY, f'{key} takes one value')
  require(not ('lengths' in settings and 'max_length' in settings), GRID_KEY,
          'give lengths or max_length, not both')
  max_length = _ints(settings, 'max_length', [4096])[0]
  doubling = [FIRST_LENGTH << k for k in range(32) if FIRST_LENGTH << k <= max_length]
  lengths = _ints(settings, 'lengths', doubling or [max_length])
  depths = _ints(settings, 'depths', [0, 25, 50, 75, 100])
  documents = _ints(settings, 'documents', [4])[0]
  seed = _ints(settings, 'seed', [0])[0]
  size = _ints(settings, 'memory_size', [256])[0]
  chunk = _ints(settings, 'chunk', [default_chunk])[0]
  names = settings.pop('memories', ['none'])
  require(all(n > 0 for n in lengths), GRID_KEY, f'lengths must be > 0, got {lengths}')
  require(all(0 <= d <= 100 for d in depths), GRID_KEY,
          f'depths are percent, in [0, 100], got {depths}')
  require(documents > 0 and chunk > 0 and seed >= 0 and size >= 0, GRID_KEY,
          'documents and chunk must be > 0, seed and memory_size >= 0')
  extras = {key: memory_sweep.parse_value(values[0]) for key, values in settings.items()}
  for key, values in settings.items():
    require(len(values) == 1, GRID_KEY, f'{key} takes one value (one grid per memory setting)')
  memories = [_memory(item, size, chunk, extras) for item in names]
  kinds = {(m.point.variant, m.point.policy) for m in memories}
  for key in extras:
    valid = sorted({k for variant, _ in kinds for k in memory_sweep.section_keys(variant)})
    require(any(memory_sweep.reads(v, p, key) for v, p in kinds), GRID_KEY,
            f'no memory of the grid reads {key!r} (grid settings: {", ".join(GRID_SETTINGS)}; '
            f'memory settings: {", ".join(valid) or "none"})'
            f'{closest_name(key, GRID_SETTINGS + tuple(valid))}')
  labels = [m.label for m in memories]
  require(len(set(labels)) == len(labels), GRID_KEY, f'a memory is given twice: {labels}')
  return PasskeyGrid(tuple(sorted(set(lengths))), tuple(sorted(set(depths))), documents, seed,
                     chunk, tuple(memories))


def memory_model_config(trained_model, vocab_size: int, memory: GridMemory):
  """The eval-time model of `memory` (the trained model with the memory's overrides), checked."""
  config = lm_model_config(trained_model, vocab_size,
                           **memory_sweep.model_overrides(memory.point, trained_model))
  try:
    resolve_model({k: v for k, v in config.to_dict().items() if k != 'vocab_size'})
  except ConfigError as error:
    raise ConfigError(GRID_KEY, f'memory {memory.label}: {error}') from None
  return config


def document_batch(documents: list, num_rows: int, chunk_len: int, bos_id: int,
                   pad_id: int) -> dict:
  """`[num_rows, n * chunk_len]` teacher-forcing arrays of `documents` (one per row, from
  position 0; padded at the end), and `answer_mask` on the answer's targets. Rows past
  `len(documents)` repeat the first document with no answer."""
  longest = max(d.tokens.size for d in documents)
  width = -(-longest // chunk_len) * chunk_len
  inputs = np.full([num_rows, width], pad_id, np.int32)
  targets = np.full([num_rows, width], pad_id, np.int32)
  answer_mask = np.zeros([num_rows, width], bool)
  for row in range(num_rows):
    document = documents[row] if row < len(documents) else documents[0]
    length = document.tokens.size
    inputs[row, 0], inputs[row, 1:length] = bos_id, document.tokens[:-1]
    targets[row, :length] = document.tokens
    if row < len(documents):
      answer_mask[row, document.answer_start:document.answer_start + document.answer_len] = True
  positions = np.tile(np.arange(width, dtype=np.int32), (num_rows, 1))
  return dict(inputs=inputs, targets=targets, positions=positions,
              segment_ids=np.zeros_like(inputs), doc_start=positions == 0,
              input_mask=inputs != pad_id, answer_mask=answer_mask)


def answer_step(params, memory, chunk: dict, model_state, *, model: DecoderLM):
  """One chunk: `(memory, {'correct', 'nll'})`, per row `[batch]`: answer tokens whose argmax
  is the target, and their summed negative log-likelihood (nats)."""
  variables = {'params': params, MODEL_STATE: model_state} if model_state else {'params': params}
  logits, memory, _ = model.apply(variables, chunk['inputs'], memory,
                                  chunk_context(chunk, deterministic=True))
  answer = chunk['answer_mask']
  hits = (jnp.argmax(logits, axis=-1) == chunk['targets']) & answer
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                        chunk['targets'])
  return memory, {'correct': jnp.sum(hits, axis=1).astype(jnp.int32),
                  'nll': jnp.sum(jnp.where(answer, nll, 0.0), axis=1)}


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

  def score(self, params, documents: list, bos_id: int, pad_id: int, model_state=None) -> dict:
    """`{'correct', 'nll'}`: numpy `[len(documents)]`, per document (see `answer_step`)."""
    totals = {'correct': [], 'nll': []}
    with sharding.activation_sharding(self.mesh, self.rules):
      for start in range(0, len(documents), self.batch_size):
        group = documents[start:start + self.batch_size]
        arrays = document_batch(group, self.batch_size, self.chunk_len, bos_id, pad_id)
        memory = self._fresh_memory()
        sums = {'correct': np.zeros(self.batch_size, np.int64), 'nll': np.zeros(self.batch_size)}
        for begin in range(0, arrays['inputs'].shape[1], self.chunk_len):
          chunk = {k: v[:, begin:begin + self.chunk_len] for k, v in arrays.items()}
          chunk = sharding.to_global_batch(chunk, self._batch_sharding)
          memory, out = self._step(params, memory, chunk, model_state or {})
          for key in sums:
            sums[key] = sums[key] + np.asarray(out[key])
        for key in totals:
          totals[key].append(sums[key][:len(group)])
    return {key: np.concatenate(parts) for key, parts in totals.items()}


def grid_documents(grid: PasskeyGrid, encode) -> list:
  """`[(length, depth percent, PasskeyDocument)]` of every cell, shortest first."""
  cells = []
  for length in grid.lengths:
    for depth in grid.depths:
      for index in range(grid.documents):
        try:
          document = passkey.seeded_document(grid.seed, length, depth / 100, index, encode)
        except ValueError as error:
          raise ConfigError(GRID_KEY, f'length {length}: {error}') from None
        cells.append((length, depth, document))
  return cells


def cell_rows(memory: GridMemory, documents: list, scores: dict) -> list[dict]:
  """One row per (length, depth) of `memory`: accuracy, digit accuracy and loss, n."""
  groups = {}
  for (length, depth, document), correct, nll in zip(documents, scores['correct'], scores['nll']):
    groups.setdefault((length, depth), []).append((int(correct), float(nll), document.answer_len))
  rows = []
  for (length, depth), results in groups.items():
    tokens = sum(n for _, _, n in results)
    rows.append(dict(memory=memory.label, length=length, depth=depth,
                     accuracy=float(np.mean([c == n for c, _, n in results])),
                     digit_accuracy=sum(c for c, _, _ in results) / tokens,
                     digit_loss=sum(x for _, x, _ in results) / tokens, n=len(results)))
  return rows


def evaluate_grid(grid: PasskeyGrid, trained_model, tokenizer, params, *, batch_size: int,
                  mesh, rules, param_shardings, model_state=None) -> list[dict]:
  """Every cell of every memory of `grid` (`cell_rows`), memory by memory."""
  documents = grid_documents(grid, tokenizer.encode)
  cells = []
  for memory in grid.memories:
    model_config = memory_model_config(trained_model, tokenizer.vocab_size, memory)
    jax.eval_shape(lambda config=model_config: DecoderLM.init_state(config, 1))
    scorer = PasskeyScorer(model_config, batch_size=batch_size, chunk_len=grid.chunk, mesh=mesh,
                           rules=rules, param_shardings=param_shardings)
    scores = scorer.score(params, [d for _, _, d in documents], tokenizer.bos_id,
                          tokenizer.pad_id, model_state)
    cells.extend(cell_rows(memory, documents, scores))
  return cells


def accuracy_table(grid: PasskeyGrid, cells: list[dict], label: str) -> np.ndarray:
  """`[depths, lengths]` accuracies of memory `label` (NaN where no cell)."""
  table = np.full([len(grid.depths), len(grid.lengths)], np.nan)
  for cell in cells:
    if cell['memory'] == label:
      table[grid.depths.index(cell['depth']), grid.lengths.index(cell['length'])] = cell['accuracy']
  return table


def png_name(label: str) -> str:
  """'attendre_lra_max:256' -> 'passkey_grid_attendre_lra_max_256.png'."""
  return 'passkey_grid_' + re.sub(r'[^A-Za-z0-9_]+', '_', label) + '.png'


def write_grid(grid: PasskeyGrid, cells: list[dict], out_dir: str, header: dict) -> dict:
  """Writes `passkey_grid.json` and one heat map per memory (module docstring), after removing
  the grid files of an earlier evaluation; returns what the JSON holds."""
  os.makedirs(out_dir, exist_ok=True)
  for old in glob.glob(os.path.join(out_dir, 'passkey_grid*')):
    os.remove(old)
  memories = []
  for memory in grid.memories:
    name = png_name(memory.label)
    write_heatmap(os.path.join(out_dir, name), accuracy_table(grid, cells, memory.label))
    memories.append(dict(memory.describe(), heatmap=name))
  axes = dict(AXES, depths=list(grid.depths), lengths=list(grid.lengths))
  result = dict(header, documents_per_cell=grid.documents, seed=grid.seed, chunk=grid.chunk,
                axes=axes, memories=memories, cells=cells)
  with open(os.path.join(out_dir, 'passkey_grid.json'), 'w') as f:
    json.dump(result, f, indent=2)
  return result


def markdown_table(grid: PasskeyGrid, cells: list[dict]) -> str:
  """Accuracy per memory and length, averaged over depths."""
  lines = ['| memory | ' + ' | '.join(str(n) for n in grid.lengths) + ' |',
           '|---|' + '---:|' * len(grid.lengths)]
  for memory in grid.memories:
    table = accuracy_table(grid, cells, memory.label)
    lines.append(f'| {memory.label} | ' + ' | '.join(f'{v:.2f}' for v in table.mean(0)) + ' |')
  return '\n'.join(lines)


def evaluate_run_grid(config, workdir: str, tokenizer, mesh, rules, params, param_shardings,
                      step: int, model_state=None) -> dict:
  """eval.py's `eval.passkey_grid`: the grid of the run's checkpoint, written to DIR/eval."""
  grid = parse_grid(config.eval.passkey_grid, config.eval.chunk_len or config.data.chunk_len)
  cells = evaluate_grid(grid, config.model, tokenizer, params,
                        batch_size=config.data.eval_batch_size, mesh=mesh, rules=rules,
                        param_shardings=param_shardings, model_state=model_state)
  header = dict(checkpoint_step=step, trained_attention=config.model.attention,
                trained_model=describe_model(config.model), trained_chunk=config.data.chunk_len,
                corpus=config.data.corpus, tokenizer=config.data.tokenizer)
  if jax.process_index() != 0:
    return dict(header, cells=cells)
  result = write_grid(grid, cells, fresh_output_dir(workdir), header)
  print(f'checkpoint step {step}, passkey accuracy (mean over depths {list(grid.depths)}%, '
        f'{grid.documents} documents per cell, chunk {grid.chunk}):')
  print(markdown_table(grid, cells))
  return result

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
                       sink); with `q_memory`, also a Q memory (below)
    knn                Memorizing Transformer's kNN memory of SIZE entries (FIFO, joint gate)
    trained            the run's own memory as trained, for a model trained with its memory
                       in the loop (configs/passkey_memory.py); `trained:SIZE` resizes it
                       (evaluation/trained_memory.py: kNN memory_size, Attendre memory_size,
                       sinks window, else mem_len)
- `chunk`: the evaluation chunk (default `eval.chunk_len`, else the training one).
- `kind` (default passkey): `attendre_qa` scores Attendre-style reading comprehension
  (data/attendre_qa.py, docs/attendre_qa.md) instead: the question first, `lengths` the
  context's bytes (>= 256), `depths` the answer passage's place in the context, the
  accuracy the exact match of the answer and its full stop (all its tokens right under
  teacher forcing: the greedy answer).
- `q_memory` (default 0): `half` gives each Attendre memory a Q memory of SIZE // 2 queries
  per layer (the paper's setting), N gives it N; others ignore it. Label `attendre_fifo:128+q64`;
  the model runs `stack='attendre_delay'` with `causal=False` (a query sees the N keys after it).
  `q_causal=1` keeps the trained causal mask instead (label `...+q64causal`, the row's
  `q_causal` true): the control in which the delay changes when a query is answered, not
  what it sees. A memory without a Q memory reads causally, even on a model trained
  with look-ahead (`causal=False`, `attendre.hide_predicted`), whose own `trained`
  memory keeps its look-ahead; under the causal mask `hide_predicted` is moot and off.
- any other key is a setting of the memories' sections (memory_sweep's
  extra keys, e.g. `rope_max_distance=511`, `top_k=32`, `lfa_gamma=0.9`),
  applied to the memories that read it.

A Q memory (any model whose total query delay D > 0, `trained` included) is scored "prompt
with delay, answer causal" (evaluation/delayed_answer_scoring.py): the prompt read with its
delayed queries, then each answer input pushed alone and its position read after a flush of
D padding tokens (then dropped), so no answer query sees a later input; rows run in lockstep,
a row sitting out the steps not its own. Per answer token: a 1-token step and a D-token flush.

Scoring otherwise: teacher forcing, [BOS] + document[:-1] in, the document as targets,
chunk by chunk with the memory carried and nothing else (the memory starts
empty at BOS). A document counts as retrieved when the argmax of every answer
token (the key's 5 digits with the byte tokenizer) is the key's token; with
the true prefix, argmax equals greedy decoding of the digits. Each cell also
reports `digit_accuracy` (answer tokens right) and `digit_loss` (nats per
answer token), and what the memory cost (evaluation/passkey_scoring.py,
memory_accounting.py): `memory_entries` (mean) and `memory_entries_max`, the
valid entries the memory holds after the document, summed over layers;
`memory_bytes`, the state's bytes per row; `seconds_per_1k_tokens`, the
reading time (compilation excluded) per 1,000 tokens read (rows x chunks);
with a kNN layer, `needle_in_top_k`: the fraction of answer tokens whose
query retrieved an entry of the needle sentence (any layer or head), and
`needle_share`: per answer token the needle's share of the entries its query
retrieved, in the kNN layer and head where that share is largest, averaged
over the answer tokens (a query retrieving at random from a memory of E
entries gets about 60 / E: the needle is 60 tokens).
Each memory's entry in the JSON carries its `peak_host_bytes` (the process's
peak resident set while it read the grid), `seconds_per_1k_tokens` over all
cells and `memory_bytes`.

Output (`write_grid`): `passkey_grid.json` with the axes, one entry per
memory and one cell per (memory, length, depth); and `passkey_grid_<memory>.png`
per memory: rows are depths (0% at the top), columns lengths (shortest at
the left), colour the accuracy (evaluation/heatmap_png.py: red 0, yellow
0.5, green 1; colour bar below).
"""

import glob
import json
import os
import re
from typing import Sequence

import jax
import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import attendre_qa, passkey
from longformer_jax.evaluation import memory_sweep, trained_memory
from longformer_jax.evaluation.delayed_answer_scoring import DelayedAnswerScorer
from longformer_jax.evaluation.heatmap_png import write_heatmap
from longformer_jax.evaluation.memory_accounting import PeakHostMemory
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.passkey_grid_spec import (  # re-exported: callers use them here
    GRID_KEY, GridMemory, PasskeyGrid, parse_grid)
from longformer_jax.evaluation.passkey_scoring import PasskeyScorer
from longformer_jax.evaluation.report_files import fresh_output_dir
from longformer_jax.models.attendre_delay import total_delay
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.model_config import resolve_model

AXES = {'rows': 'depth of the needle in percent of the filler (0: first); heat map: top to bottom',
        'columns': 'document length in tokens; heat map: left to right',
        'colour': 'accuracy (all answer tokens right): red 0, yellow 0.5, green 1; '
                  'the bar below the map runs 0 (left) to 1 (right)'}


def memory_model_config(trained_model, vocab_size: int, memory: GridMemory):
  """The eval-time model of `memory` (the trained model with the memory's overrides), checked."""
  if memory.point is None:
    overrides = trained_memory.model_overrides(trained_model, memory.trained_size)
  else:
    overrides = memory_sweep.model_overrides(memory.point, trained_model)
    if memory.point.q_memory_size:   # delayed queries: their stack, and the keys they wait for
      overrides.update(stack='attendre_delay', causal=memory.q_causal)
    else:   # no delay: teacher forcing in chunks would show a bidirectional model later tokens
      overrides['causal'] = True
    if overrides['causal'] and 'attendre' in overrides:   # moot under the causal mask
      overrides['attendre'] = dict(overrides['attendre'], hide_predicted=False)
  config = lm_model_config(trained_model, vocab_size, **overrides)
  try:
    resolve_model(config.model_values())
  except ConfigError as error:
    raise ConfigError(GRID_KEY, f'memory {memory.label}: {error}') from None
  if not config.causal and total_delay(config) == 0:
    raise ConfigError(GRID_KEY, f'memory {memory.label}: the model reads later keys '
                      '(causal=False) with no Q memory, so scoring in chunks would show it '
                      'the answer; name a memory with a Q memory')
  return config


def grid_documents(grid: PasskeyGrid, encode) -> list:
  """`[(length, depth percent, PasskeyDocument)]` of every cell, shortest first."""
  cells = []
  for length in grid.lengths:
    for depth in grid.depths:
      for index in range(grid.documents):
        try:
          if grid.kind == 'attendre_qa':
            document = attendre_qa.grid_document(grid.seed, length, depth / 100, index, encode)
          else:
            document = passkey.seeded_document(grid.seed, length, depth / 100, index, encode)
        except ValueError as error:
          raise ConfigError(GRID_KEY, f'length {length}: {error}') from None
        cells.append((length, depth, document))
  return cells


def cell_rows(memory: GridMemory, documents: list, scores: dict) -> list[dict]:
  """One row per (length, depth) of `memory`: accuracy, digit accuracy and loss, n; with the
  scorer's accounting (`passkey_scoring.PasskeyScorer.score`) also the entries the memory held
  after each document (mean, max), the state's bytes per row and the seconds per 1,000 tokens."""
  groups = {}
  for i, (length, depth, document) in enumerate(documents):
    groups.setdefault((length, depth), []).append(i)
  rows = []
  for (length, depth), members in groups.items():
    correct = [int(scores['correct'][i]) for i in members]
    answer = [documents[i][2].answer_len for i in members]
    tokens = sum(answer)
    row = dict(memory=memory.label, length=length, depth=depth,
               accuracy=float(np.mean([c == n for c, n in zip(correct, answer)])),
               digit_accuracy=sum(correct) / tokens,
               digit_loss=float(sum(scores['nll'][i] for i in members)) / tokens, n=len(members))
    if 'entries' in scores:
      held = np.asarray([scores['entries'][i] for i in members])
      row.update(memory_entries=float(held.mean()), memory_entries_max=int(held.max()),
                 memory_bytes=int(scores['state_bytes']),
                 seconds_per_1k_tokens=1000.0 * float(sum(scores['seconds'][i] for i in members))
                 / float(sum(scores['tokens'][i] for i in members)))
    if 'needle_retrieved' in scores:         # a kNN layer: did the answer's queries find it?
      row['needle_in_top_k'] = float(sum(scores['needle_retrieved'][i] for i in members)) / tokens
      row['needle_share'] = float(sum(scores['needle_share'][i] for i in members)) / tokens
    rows.append(row)
  return rows


def evaluate_grid(grid: PasskeyGrid, trained_model, tokenizer, params, *, batch_size: int,
                  mesh, rules, param_shardings, model_state=None) -> tuple[list, dict]:
  """Every cell of every memory of `grid` (`cell_rows`), memory by memory, and per memory
  label its cost: `peak_host_bytes` (the process's peak resident set while it read every
  document, `peak_host_exact` False where only the lifetime peak is known),
  `seconds_per_1k_tokens` (all cells), `memory_bytes` (state bytes per row)."""
  documents = grid_documents(grid, tokenizer.encode)
  cells, costs = [], {}
  for memory in grid.memories:
    model_config = memory_model_config(trained_model, tokenizer.vocab_size, memory)
    jax.eval_shape(lambda config=model_config: DecoderLM.init_state(config, 1))
    delayed = total_delay(model_config) > 0         # a Q memory: the answer read causally
    with PeakHostMemory() as peak:
      scorer = (DelayedAnswerScorer if delayed else PasskeyScorer)(
          model_config, batch_size=batch_size, chunk_len=grid.chunk, mesh=mesh, rules=rules,
          param_shardings=param_shardings)
      scores = scorer.score(params, [d for _, _, d in documents], tokenizer.bos_id,
                            tokenizer.pad_id, model_state)
    cells.extend(cell_rows(memory, documents, scores))
    costs[memory.label] = dict(
        peak_host_bytes=peak.bytes, peak_host_exact=peak.exact,
        seconds_per_1k_tokens=1000.0 * float(scores['seconds'].sum() / scores['tokens'].sum()),
        memory_bytes=int(scores['state_bytes']))
  return cells, costs


def accuracy_table(depths: Sequence, lengths: Sequence, cells: list[dict],
                   label: str) -> np.ndarray:
  """`[depths, lengths]` accuracies of memory `label` (NaN where no cell)."""
  table = np.full([len(depths), len(lengths)], np.nan)
  for cell in cells:
    if cell['memory'] == label:
      table[depths.index(cell['depth']), lengths.index(cell['length'])] = cell['accuracy']
  return table


def png_name(label: str) -> str:
  """'attendre_lra_max:256' -> 'passkey_grid_attendre_lra_max_256.png'."""
  return 'passkey_grid_' + re.sub(r'[^A-Za-z0-9_]+', '_', label) + '.png'


def write_grid(grid: PasskeyGrid, cells: list[dict], out_dir: str, header: dict,
               costs: dict | None = None, trained_model=None) -> dict:
  """Writes `passkey_grid.json` and one heat map per memory (module docstring), after removing
  the grid files of an earlier evaluation; returns what the JSON holds. `costs` (per memory
  label, from `evaluate_grid`) go into each memory's entry."""
  os.makedirs(out_dir, exist_ok=True)
  for old in glob.glob(os.path.join(out_dir, 'passkey_grid*')):
    os.remove(old)
  memories = []
  for memory in grid.memories:
    name = png_name(memory.label)
    write_heatmap(os.path.join(out_dir, name),
                  accuracy_table(grid.depths, grid.lengths, cells, memory.label))
    memories.append(dict(memory.describe(trained_model), heatmap=name,
                         **(costs or {}).get(memory.label, {})))
  axes = dict(AXES, depths=list(grid.depths), lengths=list(grid.lengths))
  if grid.kind == 'attendre_qa':
    axes.update(rows='depth of the answer passage in percent of the context (0: first)',
                columns='context length in bytes (the question and answer come on top)',
                colour='exact match of the answer and its full stop: red 0, yellow 0.5, green 1')
  result = dict(header, kind=grid.kind, documents_per_cell=grid.documents, seed=grid.seed,
                chunk=grid.chunk, axes=axes, memories=memories, cells=cells)
  with open(os.path.join(out_dir, 'passkey_grid.json'), 'w') as f:
    json.dump(result, f, indent=2)
  return result


def markdown_table(grid: PasskeyGrid, cells: list[dict], costs: dict | None = None) -> str:
  """Accuracy per memory and length, averaged over depths; with `costs`, also the entries held
  after the shortest and the longest documents, seconds per 1k tokens and the peak host MiB."""
  extra = ['entries held (shortest / longest)', 's / 1k tokens', 'peak host MiB'] if costs else []
  lines = ['| memory | ' + ' | '.join([str(n) for n in grid.lengths] + extra) + ' |',
           '|---|' + '---:|' * (len(grid.lengths) + len(extra))]
  for memory in grid.memories:
    table = accuracy_table(grid.depths, grid.lengths, cells, memory.label)
    values = [f'{v:.2f}' for v in table.mean(0)]
    if costs:
      held = {c['length']: c['memory_entries'] for c in cells if c['memory'] == memory.label}
      cost = costs[memory.label]
      values += [f'{held[grid.lengths[0]]:.0f} / {held[grid.lengths[-1]]:.0f}',
                 f'{cost["seconds_per_1k_tokens"]:.3f}', f'{cost["peak_host_bytes"] / 2**20:.0f}']
    lines.append(f'| {memory.label} | ' + ' | '.join(values) + ' |')
  return '\n'.join(lines)


def evaluate_run_grid(config, workdir: str, tokenizer, mesh, rules, params, param_shardings,
                      step: int, model_state=None) -> dict:
  """eval.py's `eval.passkey_grid`: the grid of the run's checkpoint, written to DIR/eval."""
  grid = parse_grid(config.eval.passkey_grid, config.eval.chunk_len or config.data.chunk_len)
  cells, costs = evaluate_grid(grid, config.model, tokenizer, params,
                               batch_size=config.data.eval_batch_size, mesh=mesh, rules=rules,
                               param_shardings=param_shardings, model_state=model_state)
  header = dict(checkpoint_step=step, trained_attention=config.model.attention,
                trained_model=describe_model(config.model), trained_chunk=config.data.chunk_len,
                corpus=config.data.corpus, tokenizer=config.data.tokenizer)
  if jax.process_index() != 0:
    return dict(header, cells=cells)
  with fresh_output_dir(workdir) as out_dir:
    result = write_grid(grid, cells, out_dir, header, costs, config.model)
  print(f'checkpoint step {step}, passkey accuracy (mean over depths {list(grid.depths)}%, '
        f'{grid.documents} documents per cell, chunk {grid.chunk}):')
  print(markdown_table(grid, cells, costs))
  return result

"""The needle's eviction scores over time in an Attendre memory (docs/passkey.md).

  python -m benchmarks.passkey_eviction_scores --workdir=workdirs/passkey_attendre_lra_max \\
      --lengths=1024,4096 --depths=0,50 --documents=4 --policies=lra_max,lfa,fifo \\
      --out=eviction_scores.json

Reads passkey documents (`data/passkey.seeded_document`, the grid's seed and
cells) chunk by chunk from BOS through the run's latest checkpoint with an
Attendre K/V memory evicting by each policy, exactly as the passkey grid
scores them: the model of the grid's memory `attendre_<policy>:SIZE`
(`passkey_grid.memory_model_config`: the trained section with the policy
swapped; SIZE the trained `attendre.memory_size` unless `--memory_size`),
stepped by the scorer's own `passkey_scoring.answer_step`. The layer sows
the memory as its policy scored it, before the step's eviction
(`attendre_scored`: attention weights `[b, h, q, M]`, the query-key mask, the
scores, positions and validity `[b, M]`). After each chunk, per layer and
document (`needle_accounting`):

- `held`: needle-sentence tokens in the memory after the chunk, `key_held`:
  those of them that are the key's digits (both copies: 10 with bytes);
- `scored`: needle entries in the memory the chunk's queries scored;
- `needle_score`: their mean score (the policy's own state), against the
  scored memory's `median`, the `threshold` (the highest score among the
  entries evicted in this step; an entry scoring above it survived) and
  `rank` (the fraction of the other scored entries scoring below the
  needle's mean: 1 = the needle scores highest);
- `needle_mass`: the attention the chunk's queries give the needle's
  entries (mean over heads, summed over the needle's slots, mean over the
  valid queries), and `mass_ratio`: per needle entry against the mean per
  valid memory entry (1: the needle is attended like any entry).

Chunks are counted from the one that holds the needle's first token (0).
Printed per policy: a table of the means over documents; `--out` writes
the table's rows and every document's per-chunk trace as JSON. Run from the
repository root (`python -m benchmarks.passkey_eviction_scores`).
"""

import argparse
import functools
import json
import re

import jax
import numpy as np

from longformer_jax.attention.attendre import AttendreState
from longformer_jax.evaluation import passkey_grid
from longformer_jax.evaluation.run_restore import read_run
from longformer_jax.evaluation.passkey_scoring import answer_step, document_batch
from longformer_jax.memory import policies
from longformer_jax.models.decoder_lm import DecoderLM

SOWN = 'attendre_scored'
FIELDS = ('held', 'key_held', 'scored', 'needle_score', 'median', 'threshold', 'rank', 'needle_mass',
          'mass_ratio')
SCORE_FIELDS = ('needle_score', 'median', 'threshold', 'rank')


def scored_layers(intermediates) -> list:
  """The `attendre_scored` dicts (numpy) the Attendre layers sowed, in layer order."""
  found = []

  def walk(tree, path):
    for key, value in tree.items():
      if key == SOWN:
        found.append((path, {k: np.asarray(v) for k, v in value[0].items()}))
      elif isinstance(value, dict):
        walk(value, path + (key,))
  walk(intermediates, ())
  number = lambda path: [int(n) for n in re.findall(r'\d+', '/'.join(path))]
  return [scored for _, scored in sorted(found, key=lambda item: number(item[0]))]


def attendre_memories(state) -> list:
  """Each Attendre layer's K/V memory (`MemoryEntries`, leaves `[b, M]`) in layer order."""
  layers = jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, AttendreState))
  return [layer.memory for layer in layers if isinstance(layer, AttendreState)]


def needle_accounting(scored: dict, after, first: np.ndarray, end: np.ndarray,
                      query_valid: np.ndarray, is_key: np.ndarray) -> dict:
  """Per row, the needle's place in one layer's memory at one step (module docstring).

  Args:
    scored: the layer's `attendre_scored` (numpy): `weights [b, h, q, M]`, `scores`,
      `positions`, `valid [b, M]`; the memory before this step's eviction.
    after: the layer's memory after the step (`positions`, `valid [b, M]`).
    first, end: `[b]` the needle's input positions are [first, end).
    query_valid: `[b, q]` the chunk's valid queries.
    is_key: `[b, W]` bool over input positions: the needle's key digits.
  Returns `{field: [b] float}` for FIELDS (NaN where undefined: no needle entry scored, no
  entry evicted, no valid query).
  """
  rows = first.shape[0]
  out = {field: np.full(rows, np.nan) for field in FIELDS}
  kept_positions, kept_valid = np.asarray(after.positions), np.asarray(after.valid)
  weights = scored['weights'].mean(axis=1)                                # [b, q, M]
  for row in range(rows):
    in_span = lambda p, lo=first[row], hi=end[row]: (p >= lo) & (p < hi)
    held = kept_valid[row] & in_span(kept_positions[row])
    out['held'][row] = held.sum()
    out['key_held'][row] = is_key[row][kept_positions[row][held]].sum()
    valid, positions = scored['valid'][row], scored['positions'][row]
    needle = valid & in_span(positions)
    scores = scored['scores'][row]
    out['scored'][row] = needle.sum()
    if valid.any():
      out['median'][row] = np.median(scores[valid])
    evicted = valid & ~np.isin(positions, kept_positions[row][kept_valid[row]])
    if evicted.any():
      out['threshold'][row] = scores[evicted].max()
    if needle.any():
      mean = scores[needle].mean()
      out['needle_score'][row] = mean
      others = valid & ~needle
      if others.any():
        out['rank'][row] = np.mean(scores[others] < mean)
    queries = query_valid[row]
    if needle.any() and queries.any():
      per_query = weights[row][queries]                                    # [q', M]
      out['needle_mass'][row] = per_query[:, needle].sum(axis=1).mean()
      memory_mass = per_query[:, valid].sum(axis=1).mean()
      if memory_mass > 0:
        out['mass_ratio'][row] = (out['needle_mass'][row] / needle.sum()) / (
            memory_mass / valid.sum())
  return out


def trace_documents(step, params, model_config, documents: list, chunk_len: int, bos_id: int,
                    pad_id: int, model_state=None) -> tuple:
  """Reads `documents` (one row each) chunk by chunk with `step` (a jitted `answer_step` with
  intermediates). Returns `(trace, correct)`: per chunk, per layer `needle_accounting`, as
  `trace[index][layer][field] [rows]`, and `correct [rows]` answer digits right."""
  arrays = document_batch(documents, len(documents), chunk_len, bos_id, pad_id)
  span = arrays['needle_span'][:, 0]
  is_key = np.zeros(arrays['inputs'].shape, bool)
  for row, document in enumerate(documents):
    key = document.tokens[document.answer_start:document.answer_start + document.answer_len]
    digits = np.isin(arrays['inputs'][row], key)
    is_key[row, span[row, 0]:span[row, 1]] = digits[span[row, 0]:span[row, 1]]
  memory = DecoderLM.init_state(model_config, len(documents))
  trace, correct = [], np.zeros(len(documents), np.int64)
  for begin in range(0, arrays['inputs'].shape[1], chunk_len):
    chunk = {k: v[:, begin:begin + chunk_len] for k, v in arrays.items()}
    memory, out = step(params, memory, chunk, model_state or {})
    correct += np.asarray(out['correct'])
    layers = zip(scored_layers(out['intermediates']), attendre_memories(memory))
    trace.append([needle_accounting(scored, after, span[:, 0], span[:, 1], chunk['input_mask'],
                                    is_key) for scored, after in layers])
  return trace, correct


def relative_rows(trace, documents: list, chunk_len: int, last: int) -> list:
  """Per document, layer and chunk `0..last` after the needle's (and the answer's chunk,
  `'answer'`): `dict(document, layer, chunk, **fields)`."""
  rows = []
  for row, document in enumerate(documents):
    needle_chunk = (document.needle_start + 1) // chunk_len          # inputs shifted by BOS
    answer_chunk = (document.answer_start + 1) // chunk_len
    wanted = {needle_chunk + k: k for k in range(last + 1) if needle_chunk + k < answer_chunk}
    wanted[answer_chunk] = 'answer'
    for index, relative in wanted.items():
      for layer, fields in enumerate(trace[index]):
        rows.append(dict(document=row, layer=layer, chunk=relative,
                         **{f: float(fields[f][row]) for f in FIELDS}))
  return rows


def mean_table(rows: list) -> list:
  """Means over documents (NaNs left out) per (layer, chunk), with the documents counted."""
  groups = {}
  for row in rows:
    groups.setdefault((row['layer'], row['chunk']), []).append(row)
  order = lambda key: (key[0], 10**9 if key[1] == 'answer' else key[1])
  table = []
  for key in sorted(groups, key=order):
    members = groups[key]
    means = {}
    for field in FIELDS:
      values = [m[field] for m in members if not np.isnan(m[field])]
      means[field] = float(np.mean(values)) if values else None
    table.append(dict(layer=key[0], chunk=key[1], n=len(members), **means))
  return table


def markdown(table: list) -> str:
  cell = lambda v, f='{:.3g}': '-' if v is None else f.format(v)
  lines = ['| layer | chunk | needle held (key digits) | needle scored | needle score | median | threshold '
           '| rank | attention on needle | per entry vs mean |',
           '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for r in table:
    lines.append(f"| {r['layer']} | {r['chunk']} | {cell(r['held'], '{:.1f}')} "
                 f"({cell(r['key_held'], '{:.1f}')}) "
                 f"| {cell(r['scored'], '{:.1f}')} | {cell(r['needle_score'])} "
                 f"| {cell(r['median'])} | {cell(r['threshold'])} | {cell(r['rank'], '{:.2f}')} "
                 f"| {cell(r['needle_mass'], '{:.4f}')} | {cell(r['mass_ratio'], '{:.2f}')} |")
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--lengths', default='1024,4096')
  parser.add_argument('--depths', default='0,50', help='percent')
  parser.add_argument('--documents', type=int, default=4)
  parser.add_argument('--policies', default='lra_max,lfa,fifo')
  parser.add_argument('--memory_size', type=int, default=0, help='0: as trained')
  parser.add_argument('--settings', default='', help="grid memory settings, e.g. 'admission=score'")
  parser.add_argument('--last', type=int, default=3, help='chunks after the needle\'s to show')
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  config, tokenizer, params, checkpoint_step, model_state = read_run(args.workdir)
  if config.model.attention != 'attendre' or config.model.attendre.per_head_scores:
    raise SystemExit(f'{args.workdir}: needs an Attendre model with one memory per row')
  chunk = config.eval.chunk_len or config.data.chunk_len
  size = args.memory_size or config.model.attendre.memory_size
  names = [f'attendre_{p}' for p in args.policies.split(',')]
  spec = (f'lengths={args.lengths};depths={args.depths};documents={args.documents};'
          f'memories={",".join(names)};memory_size={size}'
          + (f';{args.settings}' if args.settings else ''))
  grid = passkey_grid.parse_grid(spec, chunk)
  cells = passkey_grid.grid_documents(grid, tokenizer.encode)
  print(f'{args.workdir}: checkpoint step {checkpoint_step}, chunk {chunk}, grid {spec!r}')
  result = dict(workdir=args.workdir, checkpoint_step=checkpoint_step, chunk=chunk, grid=spec,
                policies={})
  for memory in grid.memories:
    model_config = passkey_grid.memory_model_config(config.model, tokenizer.vocab_size, memory)
    step = jax.jit(functools.partial(answer_step, model=DecoderLM(model_config),
                                     with_intermediates=True))
    rows, accuracy = [], {}
    for length in grid.lengths:
      for depth in grid.depths:
        documents = [d for n, p, d in cells if (n, p) == (length, depth)]
        trace, correct = trace_documents(step, params, model_config, documents, chunk,
                                         tokenizer.bos_id, tokenizer.pad_id, model_state)
        for row in relative_rows(trace, documents, chunk, args.last):
          rows.append(dict(row, length=length, depth=depth))
        accuracy[f'{length}/{depth}'] = float(correct.sum() / sum(d.answer_len for d in documents))
    if not policies.policy_from_name(memory.point.policy).uses_scores:   # fifo: no score
      rows = [dict(r, **{f: float('nan') for f in SCORE_FIELDS}) for r in rows]
    table = mean_table(rows)
    print(f'\n{memory.label} (digit accuracy per length/depth: '
          + ', '.join(f'{k} {v:.2f}' for k, v in accuracy.items()) + ')')
    print(markdown(table))
    result['policies'][memory.label] = dict(digit_accuracy=accuracy, table=table, documents=rows)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()

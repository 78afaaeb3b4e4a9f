"""What the learned memories of a passkey model keep (docs/passkey.md).

  python -m benchmarks.passkey_expiry --workdir=workdirs/passkey_expire_span \
      --lengths=256,1024,4096 --depths=0,25,50,75 --documents=4
  python -m benchmarks.passkey_expiry --workdir=workdirs/passkey_adaptive_span

Expire-Span (`model.attention=expire_span`): reads grid documents
(`data/passkey.seeded_document`, seed 0) chunk by chunk from BOS, as the
passkey grid scores them, and prints per layer the mean predicted span e_i
(tokens) of the needle sentence's tokens, of its key's first five digits and
of the filler tokens (the filler's median and max too), the needle's distance
to the answer, and how many needle tokens the layer's memory still holds when
the answer's chunk starts (byte tokenizer: offsets in the needle are bytes).
Adaptive-Span (`adaptive_span`): prints each head's learned span
(evaluation/span_report.py) and the raw `span_fraction` parameters
(z = S clip(fraction, 0, 1)). Both read the latest checkpoint. Run from the
repository root (`-m`: the script imports its eval.py).
"""

import argparse

import flax.linen as nn
import jax
import numpy as np

from benchmarks.passkey_reading import capturing_step, read_documents
from longformer_jax.data import passkey
from longformer_jax.evaluation import span_report
from longformer_jax.evaluation.run_restore import read_run
from longformer_jax.memory import fifo
from longformer_jax.models.resolved_model import lm_model_config


def per_layer(spans) -> list:
  """The captured `expire_spans` outputs, one `[b, mem + c]` array per layer, in layer order."""
  leaves = jax.tree_util.tree_flatten_with_path(spans)[0]
  arrays = [np.asarray(leaf) for _, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0]))]
  out = []
  for a in arrays:          # a scanned stack gives one [layers, b, k] leaf
    out.extend(list(a) if a.ndim == 3 else [a])
  return out


def expire_report(config, tokenizer, params, lengths, depths, documents, chunk_len):
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  step = capturing_step(model_config, lambda m, name: name == 'expire_spans')
  print(f'max_span {model_config.expire_span.max_span}, mem_len {model_config.mem_len}, '
        f'chunk {chunk_len}; spans in tokens (mean over the tokens, then the documents)')
  print('| length | depth | layer | needle | key digits | filler (mean / median / max) | needle -> answer '
        '| needle tokens held at the answer chunk |')
  print('|---:|---:|---:|---:|---:|---:|---:|---:|')
  for length, depth in [(n, p / 100) for n in lengths for p in depths]:
    docs = [passkey.seeded_document(0, length, depth, i, tokenizer.encode)
            for i in range(documents)]
    reading = read_documents(
        step, model_config, params, docs, chunk_len, tokenizer,
        per_chunk=lambda sown: [a[:, -chunk_len:] for a in per_layer(sown)])
    spans, width = reading.per_layer, reading.arrays['inputs'].shape[1]
    memories = [m for m in jax.tree_util.tree_leaves(
        reading.memory_at_answer, is_leaf=lambda x: isinstance(x, fifo.FifoMemory))
                if isinstance(m, fifo.FifoMemory)]
    for layer, s in enumerate(spans):
      needle, digits, filler, fmed, fmax, distance, kept = [], [], [], [], [], [], []
      for row, d in enumerate(docs):
        first, end = d.needle_start + 1, d.needle_start + 1 + d.needle_len
        key_at = first + len(passkey.NEEDLE.split('{key}')[0])
        is_filler = np.zeros(width, bool)
        is_filler[1:d.answer_start + 1 - len(passkey.QUESTION)] = True
        is_filler[first:end] = False
        needle.append(s[row, first:end].mean())
        digits.append(s[row, key_at:key_at + d.answer_len].mean())
        filler.append(s[row, is_filler].mean())
        fmed.append(np.median(s[row, is_filler]))
        fmax.append(s[row, is_filler].max())
        distance.append(d.answer_start + 1 - first)
        m = memories[layer]
        pos = np.asarray(m.positions[row])[np.asarray(m.valid[row])]
        kept.append(int(np.sum((pos >= first) & (pos < end))))
      print(f'| {length} | {depth:.0%} | {layer} | {np.mean(needle):.1f} | {np.mean(digits):.1f} '
            f'| {np.mean(filler):.1f} / {np.mean(fmed):.1f} / {np.max(fmax):.1f} | {np.mean(distance):.0f} '
            f'| {np.mean(kept):.1f} of {docs[0].needle_len} |')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--lengths', default='256,1024,4096')
  parser.add_argument('--depths', default='0,25,50,75', help='percent')
  parser.add_argument('--documents', type=int, default=4)
  args = parser.parse_args()
  config, tokenizer, params, step, _ = read_run(args.workdir)
  print(f'{args.workdir}: {config.model.attention}, checkpoint step {step}')
  if config.model.attention == 'expire_span':
    expire_report(config, tokenizer, params, [int(x) for x in args.lengths.split(',')],
                  [int(x) for x in args.depths.split(',')], args.documents, config.eval.chunk_len or config.data.chunk_len)
  else:
    rows = span_report.learned_spans(params, lm_model_config(config.model, tokenizer.vocab_size))
    print('learned attention spans (tokens):')
    print(span_report.markdown_spans(rows))
    blocks = nn.meta.unbox(params)['blocks']
    for name in sorted(k for k in blocks if k.startswith('layer_')):
      fraction = np.asarray(blocks[name]['attention']['span_fraction'])
      print(f'{name} span_fraction (raw): ' + ', '.join(f'{f:+.4f}' for f in fraction))


if __name__ == '__main__':
  main()

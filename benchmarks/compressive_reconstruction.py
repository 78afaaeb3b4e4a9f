"""How well a trained Compressive Transformer's compressed slots stand in for a passkey needle.

  python -m benchmarks.compressive_reconstruction --workdir=workdirs/passkey_compressive \\
      --length=1024 --depths=25,50,75 --documents=8

Reads grid documents (`data/passkey.seeded_document`, seed 0, as the passkey grid scores
them) chunk by chunk from BOS and, per layer, compares content attention (this layer's
query / key / value weights, Rae et al. 2019, sec. 3.2) over the needle chunk's original
memory entries (the layer's normalised inputs) with attention over the compressed slots that
replaced them, as the memory holds them when the answer's chunk starts. The relative error is
|attn(compressed) - attn(original)|^2 / |attn(original)|^2, for two sets of queries:
- `compressing queries`: the chunk whose insertion evicted the needle's chunk, over that
  whole chunk's entries (what the attention-reconstruction loss trains the compression on;
  `mem_len` a multiple of the chunk);
- `answer queries`: the inputs that predict the key's digits (what retrieval needs),
  over the needle's groups alone;
beside the same errors for mean pooling of each group (the paper's simplest compression),
and the share of the answer queries' content attention over the compressed part (mean over
heads and queries) that falls on the needle's slots. Needles must lie in the compressed part when the answer's chunk
starts (the script says when one does not). Run from the repository root.
"""

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.passkey_reading import capturing_step, read_documents
from longformer_jax.attention import compressive
from longformer_jax.data import passkey
from longformer_jax.evaluation.run_restore import read_run
from longformer_jax.models.resolved_model import lm_model_config


def content_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
  """The layer's content attention (`attention.compressive.content_attention`) of
  `q [n, h, e]` over every one of `keys, values [m, h, e]` -> `[n, h, e]`."""
  out = compressive.content_attention(
      jnp.asarray(q[None], jnp.float32), jnp.asarray(keys[None], jnp.float32),
      jnp.asarray(values[None], jnp.float32), jnp.ones([1, 1, q.shape[0], keys.shape[0]], bool))
  return np.asarray(out[0], np.float64)


def relative_error(estimate: np.ndarray, target: np.ndarray) -> float:
  return float(np.sum(np.square(estimate - target)) / max(np.sum(np.square(target)), 1e-30))


def layer_inputs(sown, num_layers: int) -> list:
  """The captured `attention_norm` outputs, `[b, c, d_model]` per layer, in layer order."""
  found = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(sown)[0]:
    keys = [getattr(k, 'key', getattr(k, 'name', None)) for k in path]
    layer = next(k for k in keys if isinstance(k, str) and k.startswith('layer_'))
    if 'attention_norm' in keys:
      found[int(layer.split('_')[1])] = np.asarray(leaf, np.float64)
  return [found[i] for i in range(num_layers)]


def compressed_memories(memory) -> list:
  return [m for m in jax.tree_util.tree_leaves(memory, is_leaf=lambda x: isinstance(
      x, compressive.CompressiveMemory)) if isinstance(m, compressive.CompressiveMemory)]


def report(config, tokenizer, params, length, depths, documents):
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  chunk_len = config.eval.chunk_len or config.data.chunk_len
  rate = model_config.compressive.rate
  blocks = nn.meta.unbox(params)['blocks']
  step = capturing_step(model_config,
                        lambda m, name: name == '__call__' and m.name == 'attention_norm')

  print(f'rate {rate}, mem_len {model_config.mem_len}, compressed_mem_len '
        f'{model_config.compressive.compressed_mem_len}, chunk {chunk_len}, length {length}; '
        f'relative errors |attn(compressed) - attn(original)|^2 / |attn(original)|^2, '
        f'mean over documents (learnt compression / mean pooling)')
  print('| depth | layer | compressing queries | answer queries | answer attention on the '
        'needle\'s slots |')
  print('|---:|---:|---:|---:|---:|')
  for depth in depths:
    docs = [passkey.seeded_document(0, length, depth / 100, i, tokenizer.encode)
            for i in range(documents)]
    reading = read_documents(step, model_config, params, docs, chunk_len, tokenizer,
                             per_chunk=lambda sown: layer_inputs(sown, model_config.num_layers))
    if not reading.answers_in_one_chunk:
      print(f'| {depth}% | answer chunks differ across documents; skipped |')
      continue
    held = compressed_memories(reading.memory_at_answer)
    inputs = reading.per_layer
    for layer, x in enumerate(inputs):
      weights = {n: np.asarray(blocks[f'layer_{layer}']['attention'][n]['kernel'], np.float64)
                 for n in ('query', 'key', 'value')}
      project = lambda h, n: np.einsum('ld,dhe->lhe', h, weights[n])
      errors, skipped = {'compressing': [], 'answer': [], 'compressing_mean': [],
                         'answer_mean': [], 'share': []}, 0
      compressed = held[layer].compressed
      for row, d in enumerate(docs):
        first = d.needle_start + 1 + len(passkey.NEEDLE.split('{key}')[0])   # the key's digits
        digits = np.arange(first, first + d.answer_len)
        slot_pos = np.asarray(compressed.positions[row])
        valid = np.asarray(compressed.valid[row])
        # A slot stands for the `rate` entries ending at its position; keep the needle's.
        covers = [(s, p) for s, p in enumerate(slot_pos)
                  if valid[s] and np.any((digits > p - rate) & (digits <= p))]
        if not covers:
          skipped += 1
          continue
        needle_chunk = first // chunk_len
        chunk_slots = [s for s, p in enumerate(slot_pos)
                       if valid[s] and p // chunk_len == needle_chunk]
        original_chunk = x[row, needle_chunk * chunk_len:(needle_chunk + 1) * chunk_len]
        groups = np.concatenate([np.arange(p - rate + 1, p + 1) for _, p in covers])
        slots = np.asarray(compressed.values[row], np.float64)
        pooled = original_chunk.reshape(-1, rate, original_chunk.shape[-1]).mean(axis=1)
        pooled_needle = np.stack([x[row, p - rate + 1:p + 1].mean(axis=0) for _, p in covers])
        k_, v_ = (lambda h: project(h, 'key')), (lambda h: project(h, 'value'))
        evicting = needle_chunk + model_config.mem_len // chunk_len   # its insert evicted it
        q_compress = project(x[row, evicting * chunk_len:(evicting + 1) * chunk_len], 'query')
        q_answer = project(x[row, d.answer_start:d.answer_start + d.answer_len], 'query')
        target_c = content_attention(q_compress, k_(original_chunk), v_(original_chunk))
        target_a = content_attention(q_answer, k_(x[row, groups]), v_(x[row, groups]))
        errors['compressing'].append(relative_error(content_attention(
            q_compress, k_(slots[chunk_slots]), v_(slots[chunk_slots])), target_c))
        errors['compressing_mean'].append(relative_error(content_attention(
            q_compress, k_(pooled), v_(pooled)), target_c))
        needle_slots = slots[[s for s, _ in covers]]
        errors['answer'].append(relative_error(content_attention(
            q_answer, k_(needle_slots), v_(needle_slots)), target_a))
        errors['answer_mean'].append(relative_error(content_attention(
            q_answer, k_(pooled_needle), v_(pooled_needle)), target_a))
        # The share of the answer queries' content attention over the whole compressed part
        # that falls on the needle's slots.
        logits = np.einsum('nhe,mhe->hnm', q_answer, k_(slots[valid])) / np.sqrt(q_answer.shape[-1])
        logits -= logits.max(axis=-1, keepdims=True)
        share = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
        on_needle = np.isin(np.flatnonzero(valid), [s for s, _ in covers])
        errors['share'].append(float(share[:, :, on_needle].sum(axis=-1).mean()))
      if not errors['answer']:
        print(f'| {depth}% | {layer} | no needle in the compressed part |  |  |')
        continue
      mean = {k: np.mean(v) for k, v in errors.items()}
      print(f'| {depth}% | {layer} | {mean["compressing"]:.3f} / {mean["compressing_mean"]:.3f} '
            f'| {mean["answer"]:.3f} / {mean["answer_mean"]:.3f} | {mean["share"]:.3f} '
            f'({len(errors["answer"])} documents{f", {skipped} skipped" if skipped else ""}) |')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--length', type=int, default=1024)
  parser.add_argument('--depths', default='25,50,75', help='percent')
  parser.add_argument('--documents', type=int, default=8)
  args = parser.parse_args()
  config, tokenizer, params, step, _ = read_run(args.workdir)
  print(f'{args.workdir}: {config.model.attention}, checkpoint step {step}')
  if config.model.attention != 'compressive':
    raise SystemExit(f'{args.workdir} trained {config.model.attention!r}, not compressive')
  report(config, tokenizer, params, args.length, [int(x) for x in args.depths.split(',')],
         args.documents)


if __name__ == '__main__':
  main()

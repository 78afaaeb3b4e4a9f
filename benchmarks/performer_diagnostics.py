"""What limits a trained Performer language model (configs/performer.py; docs/results.md).

  python -m benchmarks.performer_diagnostics --workdir=DIR [--max_tokens=65536] \
      [--offsets=0,25600,51200] [--feature_counts=64,256,1024,4096] \
      [--train_steps=99,124,199] [--depth]

Reads the latest checkpoint of a language-model run (`model.attention` 'performer', or
'vanilla' for the softmax side of the comparison) and prints:

1. Bits per byte on the first `max_tokens` validation tokens with every stream
   position moved by each offset (`--offsets`). Softmax attention with RoPE
   depends on position differences only; a Performer rotates q and k by RoPE at
   absolute stream positions before its fixed features, so its kernel is
   relative only in expectation over the features. A score that moves with the
   offset would show that the trained model depends on absolute stream
   positions (training positions grow by chunk_len per step). A model with
   memory is also scored with its memory emptied before every chunk (a
   Performer then sees only its chunk, as its stateless form).
2. Per layer, on the first validation batch (every row at the start of a
   document, so the chunk holds every key a query may see), the model's own
   causal attention weights over the queries that see at least 128 keys:
   Performer, phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j') with the layer's
   features W; vanilla, softmax. Their mean entropy (nats), the
   mean weight on the query's own key and on the keys at distances < 8 and < 64.
   Performer runs also give exact softmax attention exp(q_i . k_j / sqrt(d))
   normalised on the same rotated q and k: the mean total variation distance
   between the two (over every query with a key), the softmax's entropy and
   weight within 8, and the mean |q|^2 / sqrt(d) and |k|^2 / sqrt(d) (the
   exponent that drives the positive features' variance, Lemma 2).
3. With `--feature_counts` (Performer): the same total variation distance with
   fresh orthogonal features (`random_feature_matrix`, seeds 0-2, averaged) of
   each count m in place of the layer's own.
4. With `--train_steps`: bits per token of the checkpoint on the training batch
   of each of those steps (`TrainStreams.batch_at`, memory carried from step 0 as
   in training). train.py logs one batch's loss per logged step (step s: the
   batch of step s - 1, before the update), so this tells the difficulty of a
   step's batch from the model's progress.
5. With `--depth`: over the `max_tokens` validation tokens, by the target's
   position in its document (buckets of chunks: 0, 1, 2-3, 4-7, 8-15, 16+ chunks
   in), the model's bits per token and, for a Performer that carries S and z, the
   mean share of each query's normaliser phi(q) . z that comes from the carry (the
   keys of earlier chunks) rather than from the keys of its own chunk.
"""

import argparse
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.performer import random_features
from longformer_jax.data.corpus import cut_into_pieces, load_corpus, tokenize_documents
from longformer_jax.data.eval_streams import EvalStreams
from longformer_jax.data.train_streams import TrainStreams
from longformer_jax.evaluation.lm_evaluator import summarize
from longformer_jax.evaluation.run_restore import read_run
from longformer_jax.layers.positional import apply_rotary
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.train import steps
from longformer_jax.train.lm_objective import chunk_context


def validation_batches(config, tokenizer, chunk_len: int, max_tokens: int) -> list:
  documents = tokenize_documents(tokenizer, load_corpus(config.data, 'valid'),
                                 config.data.skip_undecodable)
  streams = EvalStreams(documents, config.data.eval_batch_size, chunk_len, tokenizer.bos_id,
                        tokenizer.pad_id, chunks_per_batch=1, max_tokens=max_tokens)
  return [steps.step_arrays(batch, tokenizer.pad_id) for batch in streams]


def as_device(arrays: dict) -> dict:
  return {k: jnp.asarray(v) for k, v in arrays.items()}


def offset_scores(model, params, batches, chunk_len: int, token_bytes, offsets,
                  clear_memory: bool = False) -> dict:
  """{offset: bits per byte} over `batches` with positions + offset; `clear_memory`: the
  memory emptied before every chunk."""
  step = jax.jit(functools.partial(steps.eval_step, model=model, chunk_len=chunk_len,
                                   token_bytes=token_bytes))
  rows = batches[0]['inputs'].shape[0]
  scores = {}
  for offset in offsets:
    memory, totals = DecoderLM.init_state(model.config, rows), None
    for arrays in batches:
      if clear_memory:
        memory = DecoderLM.init_state(model.config, rows)
      memory, sums = step(params, memory,
                          as_device(dict(arrays, positions=arrays['positions'] + offset)))
      totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
    totals = {k: float(v) for k, v in totals.items()}
    scores[offset] = summarize(totals['loss_sum'], totals['tokens'],
                               totals['bytes'])['bits_per_byte']
  return scores


def training_bits(model, params, config, tokenizer, train_steps) -> dict:
  """{step: bits per token} of the checkpoint on the training batch of each of `train_steps`,
  memory carried from step 0 on as in training (the streams of tasks/lm_training.py)."""
  documents = cut_into_pieces(tokenize_documents(tokenizer, load_corpus(config.data, 'train'),
                                                 config.data.skip_undecodable),
                              config.data.batch_size)
  streams = TrainStreams(documents, config.data.batch_size,
                         config.data.chunk_len * config.data.chunks_per_step, config.seed,
                         tokenizer.bos_id)
  step_fn = jax.jit(functools.partial(steps.eval_step, model=model,
                                      chunk_len=config.data.chunk_len, token_bytes=None))
  memory = DecoderLM.init_state(model.config, config.data.batch_size)
  out = {}
  for step in range(max(train_steps) + 1):
    arrays = steps.step_arrays(streams.batch_at(step), tokenizer.pad_id)
    memory, sums = step_fn(params, memory, as_device(arrays))
    if step in train_steps:
      out[step] = float(sums['loss_sum']) / float(sums['tokens']) / math.log(2.0)
  return out


def captured_projections(model, params, arrays: dict, offset: int) -> list:
  """Per attention layer (path order): (name, q, k rotated `[b, n, h, d]`, W `[m, d]` or None,
  the chunk). Performer: RoPE at the absolute positions it uses; vanilla: relative to the
  chunk's first position, as it rotates (the same softmax weights)."""
  chunk = as_device(dict(arrays, positions=arrays['positions'] + offset))
  memory = DecoderLM.init_state(model.config, chunk['inputs'].shape[0])
  _, sown = model.apply({'params': params}, chunk['inputs'], memory,
                        chunk_context(chunk, deterministic=True), mutable=['intermediates'],
                        capture_intermediates=lambda m, _: m.name in ('query', 'key'))
  flat = {jax.tree_util.keystr(path): leaf for path, leaf in
          jax.tree_util.tree_flatten_with_path(sown['intermediates'])[0]}
  layers = sorted({path.split("['query']")[0] for path in flat if "['query']" in path})
  performer = model.config.attention == 'performer'
  positions = chunk['positions'] - (0 if performer else chunk['positions'][:, :1])
  out = []
  for layer in layers:
    def pick(name):
      return next((v for p, v in flat.items() if p.startswith(layer + name)), None)
    q, k = pick("['query']"), pick("['key']")
    if not performer or model.config.performer.rotary:
      q, k = apply_rotary(q, positions), apply_rotary(k, positions)
    out.append((re.search(r'layer_\d+', layer).group(0), q, k,
                pick("['features']") if performer else None, chunk))
  return out


def causal_mask(chunk: dict) -> np.ndarray:
  """`[b, q, k]` bool: key j at or before query i, same document, valid."""
  return np.asarray(causal_document_mask(chunk['positions'], chunk['segment_ids'],
                                         chunk['positions'], chunk['segment_ids'],
                                         chunk['input_mask']))


def softmax_weights(q, k, allowed) -> np.ndarray:
  """Exact causal softmax attention `[b, h, q, k]` float64."""
  q64, k64 = (np.asarray(a, np.float64) for a in (q, k))
  logits = np.einsum('bqhd,bkhd->bhqk', q64, k64) / math.sqrt(q64.shape[-1])
  logits = np.where(allowed[:, None], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True)


def kernel_weights(q, k, features, allowed) -> np.ndarray:
  """FAVOR+ causal attention `[b, h, q, k]` float64: phi(q_i) . phi(k_j) normalised over j."""
  log_q = np.asarray(random_features.softmax_logits(q, features), np.float64)
  log_k = np.asarray(random_features.softmax_logits(k, features), np.float64)
  # A shift per query and one per (row, head) for the keys: they cancel in the ratio, and
  # float64 holds the spread of these log-features.
  phi_q = np.exp(log_q - log_q.max(-1, keepdims=True))
  phi_k = np.exp(log_k - log_k.max(axis=(1, 3), keepdims=True))
  weights = np.where(allowed[:, None], np.einsum('bqhm,bkhm->bhqk', phi_q, phi_k), 0.0)
  return weights / weights.sum(-1, keepdims=True)


def attention_shape(weights, allowed) -> dict:
  """Mean entropy and the mean weight at distances 0, < 8, < 64 over the queries that see
  at least 128 keys (so that a weight within 64 is not all the weight by construction)."""
  rows = np.broadcast_to((allowed.sum(-1) >= 128)[:, None], weights.shape[:3])
  with np.errstate(divide='ignore', invalid='ignore'):
    entropy = -np.where(weights > 0, weights * np.log(weights), 0.0).sum(-1)
  n = weights.shape[-1]
  distance = np.arange(n)[:, None] - np.arange(n)[None, :]                  # query - key
  near = {f'within_{r}': float((weights * ((distance >= 0) & (distance < r))).sum(-1)[rows].mean())
          for r in (1, 8, 64)}
  return dict(entropy=float(entropy[rows].mean()), **near)


def total_variation(a, b, allowed) -> float:
  rows = np.broadcast_to(allowed.any(-1)[:, None], a.shape[:3])
  return float((0.5 * np.abs(a - b).sum(-1))[rows].mean())


def attention_table(captured) -> str:
  lines = ['| layer | entropy (nats) | weight on own key | within 8 | within 64 | '
           'TV(kernel, softmax) | softmax: entropy | softmax: within 8 | '
           '|q|^2/sqrt(d) | |k|^2/sqrt(d) |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for layer, q, k, features, chunk in captured:
    allowed = causal_mask(chunk)
    exact = softmax_weights(q, k, allowed)
    own = exact if features is None else kernel_weights(q, k, features, allowed)
    shape = attention_shape(own, allowed)
    if features is None:
      extra = '- | - | - | - | -'
    else:
      d = q.shape[-1]
      def square(a):
        return float(np.mean(np.sum(np.square(np.asarray(a, np.float64)), -1)) / math.sqrt(d))
      softmax = attention_shape(exact, allowed)
      extra = (f"{total_variation(own, exact, allowed):.3f} | {softmax['entropy']:.2f} | "
               f"{softmax['within_8']:.3f} | {square(q):.1f} | {square(k):.1f}")
    lines.append(f"| {layer} | {shape['entropy']:.2f} | {shape['within_1']:.3f} | "
                 f"{shape['within_8']:.3f} | {shape['within_64']:.3f} | {extra} |")
  return '\n'.join(lines)


def feature_count_table(captured, counts) -> str:
  lines = ['| layer | ' + ' | '.join(f'TV, m = {m}' for m in counts) + ' |',
           '|---|' + '---:|' * len(counts)]
  for layer, q, k, _, chunk in captured:
    allowed = causal_mask(chunk)
    exact = softmax_weights(q, k, allowed)
    gaps = []
    for m in counts:
      draws = [random_features.random_feature_matrix(jax.random.PRNGKey(seed), m, q.shape[-1])
               for seed in range(3)]
      gaps.append(np.mean([total_variation(kernel_weights(q, k, w, allowed), exact, allowed)
                           for w in draws]))
    lines.append(f'| {layer} | ' + ' | '.join(f'{g:.3f}' for g in gaps) + ' |')
  return '\n'.join(lines)


DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16)    # chunks into the document: 0, 1, 2-3, 4-7, 8-15, 16+


def depth_bucket(chunks_in: np.ndarray) -> np.ndarray:
  return np.searchsorted(np.asarray(DEPTH_BUCKETS), chunks_in, side='right') - 1


def log_normalisers(q, k, features, allowed, state) -> tuple:
  """log phi(q_i) . z over the carry and over the chunk's visible keys, `[b, n, h]` float64
  each (a common factor of both left out)."""
  log_q = np.asarray(random_features.softmax_logits(q, features), np.float64)   # [b, n, h, m]
  log_k = np.asarray(random_features.softmax_logits(k, features), np.float64)
  with np.errstate(divide='ignore'):
    carried = np.log(np.asarray(state.normaliser, np.float64)) + np.asarray(state.shift)
  terms = log_q + carried[:, None]
  top = np.max(terms, -1, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  with np.errstate(divide='ignore'):         # an empty carry: log 0 = -inf, share 0
    log_carry = np.log(np.exp(terms - top).sum(-1)) + top[..., 0]
  q_top, k_top = log_q.max(-1, keepdims=True), log_k.max(axis=(1, 3), keepdims=True)
  pairs = np.einsum('bqhm,bkhm->bqhk', np.exp(log_q - q_top), np.exp(log_k - k_top))
  pairs = np.where(allowed[:, :, None], pairs, 0.0)
  log_chunk = np.log(pairs.sum(-1)) + q_top[..., 0] + k_top[..., 0]
  return log_carry, log_chunk


def depth_profile(model, params, batches) -> tuple:
  """(bits per token by depth bucket, {layer: carry share by depth bucket}) (docstring, 5)."""
  performer = model.config.attention == 'performer'
  carries = performer and model.config.performer.carry_state

  @jax.jit
  def forward(memory, chunk):
    (logits, memory, _), sown = model.apply(
        {'params': params}, chunk['inputs'], memory, chunk_context(chunk, deterministic=True),
        mutable=['intermediates'], capture_intermediates=lambda m, _: m.name in ('query', 'key'))
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)),
                               chunk['targets'][..., None], -1)[..., 0]
    return memory, nll, sown['intermediates']

  rows = batches[0]['inputs'].shape[0]
  memory = DecoderLM.init_state(model.config, rows)
  start = np.zeros(rows, np.int64)                 # stream position of each row's document start
  loss, count = np.zeros(len(DEPTH_BUCKETS)), np.zeros(len(DEPTH_BUCKETS))
  share, share_count = {}, {}
  for arrays in batches:
    chunk = as_device(arrays)
    # The document start at or before each token: doc_start marks it.
    starts = np.where(arrays['doc_start'], arrays['positions'], -1)
    starts = np.maximum.accumulate(np.concatenate([start[:, None], starts], 1), 1)[:, 1:]
    start = starts[:, -1]
    buckets = depth_bucket((arrays['positions'] - starts) // arrays['inputs'].shape[1])
    incoming = memory
    memory, nll, sown = forward(memory, chunk)
    mask = arrays['target_mask'] & arrays['input_mask']
    np.add.at(loss, buckets[mask], np.asarray(nll)[mask])
    np.add.at(count, buckets[mask], 1)
    if not carries:
      continue
    flat = {jax.tree_util.keystr(path): leaf for path, leaf in
            jax.tree_util.tree_flatten_with_path(sown)[0]}
    allowed = causal_mask(chunk)
    for index, state in enumerate(incoming):
      layer = f'layer_{index}'
      def pick(name):
        return next(v for p, v in flat.items() if f"['{layer}']" in p and p.endswith(name))
      q, k = pick("['query']['__call__'][0]"), pick("['key']['__call__'][0]")
      if model.config.performer.rotary:
        q, k = apply_rotary(q, chunk['positions']), apply_rotary(k, chunk['positions'])
      log_carry, log_chunk = log_normalisers(q, k, pick("['features'][0]"), allowed, state)
      sees = (np.asarray(state.valid)[:, None]
              & (arrays['segment_ids'] == np.asarray(state.segment_ids)[:, None]) & mask)
      fraction = 1.0 / (1.0 + np.exp(log_chunk - log_carry))                  # [b, n, h]
      sums = share.setdefault(layer, np.zeros(len(DEPTH_BUCKETS)))
      counts = share_count.setdefault(layer, np.zeros(len(DEPTH_BUCKETS)))
      np.add.at(sums, buckets[sees], fraction[sees].mean(-1))
      np.add.at(counts, buckets[sees], 1)
  bits = loss / np.maximum(count, 1) / math.log(2.0)
  return bits, count, {layer: share[layer] / np.maximum(share_count[layer], 1)
                       for layer in share}


def depth_table(bits, count, shares) -> str:
  names = [f'{lo}' if hi - lo == 1 else f'{lo}-{hi - 1}' for lo, hi in
           zip(DEPTH_BUCKETS, DEPTH_BUCKETS[1:])] + [f'{DEPTH_BUCKETS[-1]}+']
  lines = ['| chunks into the document | ' + ' | '.join(names) + ' |',
           '|---|' + '---:|' * len(names),
           '| targets | ' + ' | '.join(f'{int(c)}' for c in count) + ' |',
           '| bits/token | ' + ' | '.join(f'{b:.3f}' for b in bits) + ' |']
  for layer, values in shares.items():
    lines.append(f'| {layer}: carry share of the normaliser | '
                 + ' | '.join(f'{v:.2f}' for v in values) + ' |')
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--max_tokens', type=int, default=65536)
  parser.add_argument('--offsets', default='0', help='comma list of position offsets')
  parser.add_argument('--feature_counts', default='', help='comma list of m (Performer)')
  parser.add_argument('--train_steps', default='', help='comma list of training steps')
  parser.add_argument('--depth', action='store_true', help='the profile over document depth')
  args = parser.parse_args()
  config, tokenizer, params, step, _ = read_run(args.workdir)
  chunk_len = config.data.chunk_len
  model = DecoderLM(lm_model_config(config.model, tokenizer.vocab_size))
  batches = validation_batches(config, tokenizer, chunk_len, args.max_tokens)
  print(f'{args.workdir}: {config.model.attention}, step {step}, {len(batches)} validation '
        f'batches of {batches[0]["inputs"].shape}')
  if args.train_steps:
    scored = training_bits(model, params, config, tokenizer,
                           [int(s) for s in args.train_steps.split(',')])
    print('\n| training step | batch bits/token (this checkpoint) |\n|---:|---:|')
    for train_step, bits in scored.items():
      print(f'| {train_step} | {bits:.4f} |')
  token_bytes = jnp.asarray(tokenizer.token_byte_lengths(), jnp.float32)
  token_bytes = jnp.pad(token_bytes, (0, model.config.vocab_size - token_bytes.shape[0]))
  offsets = [int(o) for o in args.offsets.split(',')]
  print('\n| position offset | bits/byte |\n|---:|---:|')
  for offset, bits in offset_scores(model, params, batches, chunk_len, token_bytes,
                                    offsets).items():
    print(f'| {offset} | {bits:.4f} |')
  if jax.tree_util.tree_leaves(DecoderLM.init_state(model.config, 1)):
    bits = offset_scores(model, params, batches, chunk_len, token_bytes, [0], True)[0]
    print(f'| 0, memory emptied before every chunk | {bits:.4f} |')
  if args.depth:
    print('\n' + depth_table(*depth_profile(model, params, batches)))
  captured = captured_projections(model, params, batches[0], 0)
  print('\n' + attention_table(captured))
  if args.feature_counts:
    print('\n' + feature_count_table(captured, [int(m) for m in args.feature_counts.split(',')]))


if __name__ == '__main__':
  main()

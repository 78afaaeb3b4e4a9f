"""Scoring throughput of the lm-eval backend against eval.py's evaluator: one model, one host, one run.

  python -m benchmarks.harness_throughput --workdir=W [--max_tokens=32768] [--repeats=3]

Both read the same documents (the first whole documents of the run's `valid` split, eval.py's
default, up to `--max_tokens` tokens) with the same chunks and memory (eval.py's: the run's
`data.chunk_len`, or an import's context, and its memory as trained), `data.eval_batch_size`
rows side by side:

- eval.py's `Evaluator` (evaluation/lm_evaluator.py): the documents packed into rows as
  eval.py's streams pack them, the memory reset at each BOS;
- the backend's rolling log-likelihood (generation/harness/harness_lm.py), one request per
  document, requests longest first, each row padded to its batch's longest.

One untimed pass each first (compilation), then `--repeats` timed passes, alternating.
Tokens/s counts the documents' tokens (the same for both; eval.py also scores the BOS that
ends each document), the median over the repeats. The last line:
`eval_tokens_per_s=... harness_tokens_per_s=... ratio=...` (harness / eval.py).
"""

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

import jax  # pylint: disable=g-import-not-at-top
from lm_eval.api.instance import Instance

from longformer_jax.data.corpus import load_corpus
from longformer_jax.evaluation.lm_evaluator import Evaluator
from longformer_jax.evaluation.run_restore import restore_params
from longformer_jax.generation.harness.harness_lm import LongformerJaxLM
from longformer_jax.generation.harness.harness_settings import HarnessSettings
from longformer_jax.parallel.mesh import make_mesh


def held_out_texts(config, tokenizer, max_tokens: int) -> list[str]:
  """The first whole documents of the `valid` split, up to `max_tokens` tokens in all."""
  texts, total = [], 0
  for document in load_corpus(config.data, 'valid'):
    try:
      text = document.data.decode('utf-8')
    except UnicodeDecodeError:
      continue
    texts.append(text)
    total += len(tokenizer.encode(text))
    if total >= max_tokens:
      break
  return texts


def timed(function) -> float:
  started = time.perf_counter()
  function()
  return time.perf_counter() - started


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--max_tokens', type=int, default=32768)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()

  lm = LongformerJaxLM(settings=HarnessSettings(workdir=args.workdir, tasks=()).validate())
  scoring = lm.scoring_run
  config, tokenizer = scoring.run.config, scoring.run.tokenizer
  texts = held_out_texts(config, tokenizer, args.max_tokens)
  documents = [tokenizer.encode(text) for text in texts]
  tokens = sum(len(document) for document in documents)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  params, shardings, _, model_state = restore_params(config, tokenizer, args.workdir, mesh, rules)
  evaluator = Evaluator(scoring.model_config, tokenizer,
                        batch_size=config.data.eval_batch_size, chunk_len=scoring.chunk_len,
                        mesh=mesh, rules=rules, param_shardings=shardings)
  requests = [Instance('loglikelihood_rolling', {}, (text,), index)
              for index, text in enumerate(texts)]

  def eval_pass():
    evaluator.evaluate(params, documents, model_state=model_state)

  def harness_pass():
    lm.loglikelihood_rolling(requests)

  print(f'{args.workdir}: {scoring.memory_description()["memory"]}; {len(texts)} documents, '
        f'{tokens} tokens, {config.data.eval_batch_size} rows, {jax.devices()[0].platform}')
  print(f'first passes (compilation included): eval.py {timed(eval_pass):.2f} s, harness '
        f'{timed(harness_pass):.2f} s')
  eval_seconds, harness_seconds = [], []
  positions_before = lm.scorer.counts.positions
  for _ in range(args.repeats):
    eval_seconds.append(timed(eval_pass))
    harness_seconds.append(timed(harness_pass))
  padded = (lm.scorer.counts.positions - positions_before) / args.repeats
  eval_rate = tokens / statistics.median(eval_seconds)
  harness_rate = tokens / statistics.median(harness_seconds)
  print(f'eval.py passes: {", ".join(f"{s:.2f}" for s in eval_seconds)} s; harness passes: '
        f'{", ".join(f"{s:.2f}" for s in harness_seconds)} s; the harness read '
        f'{padded:.0f} positions ({tokens / padded:.0%} of them tokens)')
  print(f'eval_tokens_per_s={eval_rate:.0f} harness_tokens_per_s={harness_rate:.0f} '
        f'ratio={harness_rate / eval_rate:.2f}')


if __name__ == '__main__':
  main()

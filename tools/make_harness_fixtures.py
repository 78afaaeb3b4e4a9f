"""Builds the local lm-eval tasks of tests/evaluation/test_harness.py and transformers' answers
to them (dev-only tool).

Needs `torch` and `transformers` (not project requirements; the fixtures of
tests/data/hf were made with transformers 5.24.0):
  pip install torch==2.13.0 transformers==5.24.0
  python tools/make_harness_fixtures.py [--out=tests/data/harness]

Writes to `<out>/`, from a fixed seed over the words `w4` ... `w95` of the Hugging Face
fixtures' word-level vocabulary (tests/data/hf/*/tokenizer.json):

- `choice.jsonl`: 50 multiple-choice items (a context of 4-30 words, four continuations
  of 1-4 words, the gold index), the task `harness_choice` (`harness_choice.yaml`);
- `rolling.jsonl`: 8 texts of 20-280 words, the rolling-perplexity task `harness_rolling`;
- `generate.jsonl`: 6 prompts of 5-30 words, the task `harness_generate` (greedy, 8 tokens,
  until "w50");
- `reference_<fixture>.json` for the fixtures `gpt2_long` and `llama_long` (contexts of 300
  and 320 tokens, so every request fits): lm-eval's `simple_evaluate` of the three tasks
  with `TransformersReference`, an lm-eval model over transformers' own model. Per task,
  `responses[doc_id]` is what the model answered (multiple choice: `[log-probability,
  greedy]` per choice; rolling: the log-probability; generation: the text) and `metrics`
  lm-eval's aggregate metrics.

`TransformersReference` reads every request as the harness does (docs/evaluation.md,
"lm-evaluation-harness"): one sequence `[BOS] + tokens`, the BOS being `<s>` (the
project's beginning of a document), tokens from the fixture's tokenizer.json through
transformers' tokenizer, split into context and continuation by lm-eval's `TemplateLM`;
the whole sequence in one forward pass (no chunks, no memory); greedy choices range over
the vocabulary without the padding token, and generation stops at BOS or EOS or a stop
string, as generate.py's. The YAML files and `local_datasets.py` are written by hand.
Seeds are fixed, so a rerun writes the same files.
"""

import argparse
import json
import os

import numpy as np
import torch
import transformers
from lm_eval import simple_evaluate
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.tasks import TaskManager

HF_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests',
                       'data', 'hf')
FIXTURES = ('gpt2_long', 'llama_long')
TASKS = ('harness_choice', 'harness_rolling', 'harness_generate')
WORDS = [f'w{i}' for i in range(4, 96)]
BOS, EOS, PAD = '<s>', '</s>', '<pad>'


def words(rng: np.random.Generator, low: int, high: int) -> str:
  return ' '.join(rng.choice(WORDS, int(rng.integers(low, high + 1))))


def write_jsonl(path: str, rows: list) -> None:
  with open(path, 'w') as f:
    for row in rows:
      f.write(json.dumps(row) + '\n')


def write_task_data(out: str) -> None:
  rng = np.random.default_rng(2024)
  write_jsonl(os.path.join(out, 'choice.jsonl'), [
      {'context': words(rng, 4, 30), 'choices': [words(rng, 1, 4) for _ in range(4)],
       'gold': int(rng.integers(4))} for _ in range(50)])
  write_jsonl(os.path.join(out, 'rolling.jsonl'), [{'text': words(rng, 20, 280)}
                                                  for _ in range(8)])
  write_jsonl(os.path.join(out, 'generate.jsonl'), [{'prompt': words(rng, 5, 30)}
                                                   for _ in range(6)])


class TransformersReference(TemplateLM):
  """transformers' model as an lm-eval model, reading requests as the harness does."""

  def __init__(self, hf_dir: str):
    super().__init__()
    self.model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32).eval()
    self.words = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(hf_dir, 'tokenizer.json'))
    self.bos, self.eos, self.pad = (self.words.convert_tokens_to_ids(name)
                                    for name in (BOS, EOS, PAD))

  @property
  def eot_token_id(self):
    return self.eos

  @property
  def prefix_token_id(self):
    return self.bos

  def tok_encode(self, string, add_special_tokens=None, **kwargs):
    ids = self.words.encode(string, add_special_tokens=False)
    return ids if add_special_tokens is False else [self.bos] + ids

  def log_probs(self, ids: list) -> torch.Tensor:
    """float64 `[len(ids) - 1, vocab]` log-probabilities of each next token."""
    with torch.no_grad():
      logits = self.model(torch.tensor([ids[:-1]])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)

  def greedy(self, logits: torch.Tensor) -> torch.Tensor:
    masked = logits.clone()
    masked[..., self.pad] = -torch.inf
    return masked.argmax(dim=-1)

  def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
    results = []
    for _, context, continuation in requests:
      ids = list(context) + list(continuation)
      scored = self.log_probs(ids)[-len(continuation):]
      targets = torch.tensor(continuation)
      total = scored.gather(1, targets[:, None]).sum().item()
      results.append((total, bool((self.greedy(scored) == targets).all())))
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm=False):
    results = []
    for (text,) in [request.args for request in requests]:
      ids = [self.bos] + self.tok_encode(text, add_special_tokens=False)
      scored = self.log_probs(ids)
      results.append(scored.gather(1, torch.tensor(ids[1:])[:, None]).sum().item())
    return results

  def generate_until(self, requests, disable_tqdm=False):
    texts = []
    for context, gen_kwargs in [request.args for request in requests]:
      kwargs = normalize_gen_kwargs(gen_kwargs, 256)
      stops = [stop for stop in kwargs['until'] if stop]
      ids, chosen, text = self.tok_encode(context), [], ''
      for _ in range(kwargs['max_gen_toks']):
        with torch.no_grad():
          logits = self.model(torch.tensor([ids])).logits[0, -1]
        token = int(self.greedy(logits))
        if token in (self.bos, self.eos):
          break
        chosen.append(token)
        ids.append(token)
        text = self.words.decode(chosen, skip_special_tokens=True)
        if any(stop in text for stop in stops):
          text = min((text.split(stop)[0] for stop in stops if stop in text), key=len)
          break
      texts.append(text)
    return texts


def reference_answers(hf_dir: str, out: str) -> dict:
  results = simple_evaluate(
      model=TransformersReference(hf_dir), tasks=list(TASKS),
      task_manager=TaskManager(include_path=out, include_defaults=False),
      bootstrap_iters=0, log_samples=True)
  answers = {}
  for task in TASKS:
    samples = sorted(results['samples'][task], key=lambda sample: sample['doc_id'])
    responses = [[response[0] if task != 'harness_choice' else list(response[0])
                  for response in sample['resps']] for sample in samples]
    if task != 'harness_choice':
      responses = [response[0] for response in responses]
    metrics = {key: value for key, value in results['results'][task].items()
               if isinstance(value, float) and 'stderr' not in key}
    answers[task] = {'responses': responses, 'metrics': metrics}
  return answers


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default=os.path.join(os.path.dirname(HF_DATA), 'harness'))
  args = parser.parse_args()
  write_task_data(args.out)
  for name in FIXTURES:
    answers = reference_answers(os.path.join(HF_DATA, name), args.out)
    answers['transformers_version'] = transformers.__version__
    with open(os.path.join(args.out, f'reference_{name}.json'), 'w') as f:
      json.dump(answers, f, indent=1)
    print(f'wrote reference_{name}.json')


if __name__ == '__main__':
  main()

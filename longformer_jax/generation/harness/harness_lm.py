"""A run as an lm-evaluation-harness model: `lm_eval` model name 'longformer_jax'.

`LongformerJaxLM` implements the three request types of `lm_eval.api.model.LM`
over a run workdir (trained here, or imported with `convert.hf`), reading every
request as one document through the model's memory (scoring_run.py,
request_scorer.py):

- `loglikelihood(context, continuation)`: the request is `[BOS] + context` and
  the continuation's tokens, split as lm-eval's `TemplateLM` splits them (the
  whole text encoded, the context's tokens cut off; an empty context is the BOS
  alone); returns the continuation's log-probability and whether greedy decoding
  would produce it;
- `loglikelihood_rolling(text)`: the log-probability of every token of the text
  after the BOS, read chunk by chunk with the memory carried: eval.py's loss on
  the same document and chunks, less its one extra target (the BOS that ends the
  document in eval.py's streams, data/eval_streams.py);
- `generate_until(context, gen_kwargs)`: generate.py's greedy decoding of the
  prompt `[BOS] + context` (generation/text_generation.py, its decoder from
  generation/run_decoder.py), ending at `until`, `max_gen_toks` or the end of the
  document; sampling (`do_sample`) is refused.

A model that carries no memory across chunks refuses, in one line naming the
chunk setting, a request longer than one chunk (scoring_run.py). `get_model_info`
(in lm-eval's results under `config`) says which memory and chunks were used.
"""

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs

from longformer_jax.config.errors import UserError
from longformer_jax.generation.harness.harness_settings import HarnessSettings
from longformer_jax.generation.harness.request_scorer import RequestScorer
from longformer_jax.generation.harness.scoring_run import ScoringRun, load_scoring_run
from longformer_jax.generation.sampling import SamplingSettings
from longformer_jax.generation.text_generation import allowed_tokens, generate_text

MODEL_NAME = 'longformer_jax'
DEFAULT_MAX_GEN_TOKS = 256     # lm-eval's default when a task sets none
GREEDY = SamplingSettings(temperature=0.0)


def batch_size_of(value, run: ScoringRun, settings: HarnessSettings) -> int:
  """The rows scored side by side: `value` (lm-eval's, or the settings'), else the run's
  `data.eval_batch_size`."""
  if isinstance(value, str):
    if not value.isdigit():
      raise settings.error('batch_size', f'{value!r}: give a number of rows (no "auto")')
    value = int(value)
  return int(value or settings.batch_size or run.run.config.data.eval_batch_size)


@register_model(MODEL_NAME)
class LongformerJaxLM(TemplateLM):
  """The backend (module doc). Built from `model_args` (`workdir=W,chunk_len=C,
  memory_size=M,step=S`) by lm-eval, or from a loaded run with `from_scoring_run`."""

  def __init__(self, workdir: str = '', batch_size=None, max_batch_size=None, device=None,
               step: int = -1, chunk_len: int = 0, memory_size: int = 0,
               settings: HarnessSettings | None = None, scoring_run: ScoringRun | None = None):
    del max_batch_size, device            # lm-eval's; rows are `batch_size`, on one device
    super().__init__()
    self.settings = (settings or HarnessSettings(
        workdir=workdir, tasks=(), step=int(step), chunk_len=int(chunk_len),
        memory_size=int(memory_size))).validate()
    self.scoring_run = scoring_run or load_scoring_run(self.settings)
    run = self.scoring_run.run
    self.run_tokenizer = run.tokenizer
    self.scorer = RequestScorer(
        self.scoring_run.model_config, run.params, run.model_state,
        chunk_len=self.scoring_run.chunk_len,
        batch_size=batch_size_of(batch_size, self.scoring_run, self.settings),
        pad_id=run.tokenizer.pad_id,
        allowed=allowed_tokens(run.tokenizer, self.scoring_run.model_config.vocab_size),
        fit_chunk=self.scoring_run.fits_chunk)
    self._decoder = None

  @classmethod
  def from_scoring_run(cls, scoring_run: ScoringRun, settings: HarnessSettings,
                       batch_size: int = 0) -> 'LongformerJaxLM':
    return cls(batch_size=batch_size, settings=settings, scoring_run=scoring_run)

  # Tokens. Every request is a document: BOS first, as eval.py and generate.py read one.
  @property
  def eot_token_id(self) -> int:
    eos = getattr(self.run_tokenizer, 'eos_id', None)
    return self.run_tokenizer.bos_id if eos is None or eos < 0 else int(eos)

  @property
  def prefix_token_id(self) -> int:
    return int(self.run_tokenizer.bos_id)

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
    """The text's ids, after the BOS unless `add_special_tokens` is False."""
    del kwargs
    ids = [int(i) for i in self.run_tokenizer.encode(string)]
    return ids if add_special_tokens is False else [self.prefix_token_id] + ids

  def tok_decode(self, tokens, **kwargs) -> str:
    del kwargs
    return self.run_tokenizer.decode(np.atleast_1d(np.asarray(tokens)))

  def check_fits(self, positions: int, what: str) -> None:
    """Refuses a request that reads more than one chunk of `positions` when no memory
    carries across chunks (module doc)."""
    run = self.scoring_run
    if positions <= run.chunk_len or run.carries_memory:
      return
    context = (f" (the checkpoint's context)" if run.run.imported and
               run.chunk_len == run.run.imported['context_len'] else '')
    raise self.settings.error(
        'chunk_len', f'{what} reads {positions} tokens, more than one chunk of '
        f'{run.chunk_len}{context}, and {run.memory_description()["attention"]} keeps no memory '
        'across chunks: its start would be cut off. Score shorter requests, or a model with '
        'a memory (trained with one, or --memory_size for one whose size is a setting)')

  # The three request types.
  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    """`requests`: `((context, continuation), context_ids, continuation_ids)`, the context's
    ids BOS first (`tok_encode`, or lm-eval's BOS for an empty context)."""
    del disable_tqdm, kwargs
    sequences, scored = [], []
    for (context, _), context_ids, continuation_ids in requests:
      sequence = list(context_ids) + list(continuation_ids)
      self.check_fits(len(sequence) - 1, f'the loglikelihood request {context[:40]!r}...')
      sequences.append(sequence)
      scored.append(len(continuation_ids))
    results = self.scorer.score(sequences, scored)
    for (strings, _, _), result in zip(requests, results):
      self.cache_hook.add_partial('loglikelihood', strings, result)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    del disable_tqdm
    sequences, scored = [], []
    for (text,) in [request.args for request in requests]:
      tokens = self.tok_encode(text, add_special_tokens=False)
      self.check_fits(len(tokens), f'the rolling loglikelihood of {text[:40]!r}...')
      sequences.append([self.prefix_token_id] + tokens)
      scored.append(len(tokens))
    results = [log_prob for log_prob, _ in self.scorer.score(sequences, scored)]
    for request, result in zip(requests, results):
      self.cache_hook.add_partial('loglikelihood_rolling', request.args, result)
    return results

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    del disable_tqdm
    texts = []
    for context, gen_kwargs in [request.args for request in requests]:
      kwargs = normalize_gen_kwargs(gen_kwargs, DEFAULT_MAX_GEN_TOKS)
      if kwargs.get('do_sample'):
        raise UserError(f'generation_kwargs {gen_kwargs}: do_sample=True, but the harness '
                        'decodes greedily, as generate.py --temperature=0')
      stops = [stop for stop in kwargs['until'] if stop]
      max_new_tokens = int(kwargs['max_gen_toks'])
      prompt_len = len(self.tok_encode(context))
      self.check_fits(prompt_len + max_new_tokens - 1,
                      f'the generation request {context[:40]!r}... (with max_gen_toks '
                      f'{max_new_tokens})')
      result = generate_text(self.decoder(), self.run_tokenizer, context, settings=GREEDY,
                             max_new_tokens=max_new_tokens, stops=stops)
      texts.append(result.text)
      self.cache_hook.add_partial('generate_until', (context, gen_kwargs), result.text)
    return texts

  def decoder(self):
    """The greedy decoder, built on first use (scoring_run.py)."""
    if self._decoder is None:
      self._decoder = self.scoring_run.decoder()
    return self._decoder

  def get_model_info(self) -> dict:
    counts = self.scorer.counts
    return dict(self.scoring_run.memory_description(), backend=MODEL_NAME,
                rows_per_batch=self.scorer.batch_size, scored_tokens=counts.tokens,
                scored_positions=counts.positions, scoring_seconds=round(counts.seconds, 3))

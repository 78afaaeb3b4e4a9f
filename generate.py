"""Generates text from a checkpoint of any causal language model, memory carried.

  python generate.py --workdir=DIR --prompt='def main(' [--max_new_tokens=256] \
      [--temperature=0.8] [--top_k=40] [--top_p=0.95] [--seed=0] [--stop='\n\n' ...] \
      [--prompt_file=PATH] [--prompt_ids=1,2,3 | --prompt_ids_file=PATH] [--step=N] [--kv_cache=M]

The model, tokenizer and chunk length come from the run's `DIR/config.json`
(written by train.py; a phased run uses the phase of the checkpoint), the
parameters and model state from its latest checkpoint (or `--step`). The
prompt is read as one document, `[BOS] + tokens`, chunk by chunk with every
layer's memory carried (XL cache, compressive and kNN memories, sinks, ...),
so a prompt far longer than the chunk costs constant memory; each new token
re-runs the current chunk (docs/generation.md: exactness, cost, and which
models cannot generate). `--kv_cache=M` (vanilla models, imported ones
included) decodes one token per step with a cache of the last M tokens' keys
and values per layer instead (generation/kv_cache.py). An imported checkpoint
(its workdir holds hf_import.json) decodes by default exactly as the original
within its context, and says on stderr when the text passes it
(generation/context.py). `--prompt_ids` (or a file of ids) continues the ids
as given (no BOS added) and prints the chosen ids, comma-separated, for exact
comparisons with the original model. The continuation is printed to stdout as it is
produced; generation ends after `--max_new_tokens` tokens, at the first
`--stop` string (not printed) or when the model ends the document.

Sampling: `--temperature=0` is greedy; otherwise tokens are drawn with the
temperature, top-k (0: off) and top-p (1: off), from `--seed`. Bad input (no
checkpoint, an empty or non-UTF-8 prompt, a bad sampling value, a model that
cannot generate) is one line on stderr with exit status 2 (`--debug`: the
traceback). Generation runs on one device.
"""

import os
import sys

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import flags

from longformer_jax import command_line
from longformer_jax.config.errors import UserError
# load_decoder and run_config stay reachable as generate.load_decoder / generate.run_config.
from longformer_jax.generation.run_decoder import load_decoder
from longformer_jax.generation.sampling import SamplingError, SamplingSettings
from longformer_jax.generation.saved_run import run_config
from longformer_jax.generation.text_generation import generate_text
from longformer_jax.train.quiet_logs import show_own_info_only

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the flags; called only when the script runs, so tests can import it."""
  flags.DEFINE_string('workdir', command_line.DEFAULT_WORKDIR, 'The training run to generate from.')
  flags.DEFINE_string('prompt', None, 'The text to continue.')
  flags.DEFINE_string('prompt_file', None, 'A UTF-8 file holding the text to continue.')
  flags.DEFINE_string('prompt_ids', None, 'Token ids to continue, comma-separated, read as '
                      'given (no BOS added); prints the chosen ids.')
  flags.DEFINE_string('prompt_ids_file', None, 'A file of token ids (comma- or '
                      'whitespace-separated), as --prompt_ids.')
  flags.DEFINE_integer('max_new_tokens', 256, 'Most tokens to generate.')
  flags.DEFINE_float('temperature', 1.0, 'Sampling temperature; 0 is greedy decoding.')
  flags.DEFINE_integer('top_k', 0, 'Sample among the k most likely tokens (0: off).')
  flags.DEFINE_float('top_p', 1.0, 'Sample within the nucleus of probability p (1: off).')
  flags.DEFINE_integer('seed', 0, 'Seed of the sampling keys.')
  flags.DEFINE_multi_string('stop', [], 'A string that ends generation (not printed); repeatable.')
  flags.DEFINE_integer('step', -1, 'Checkpoint step to read (-1: the latest).')
  flags.DEFINE_integer('kv_cache', -1, 'Decode one token per step with a key/value cache of '
                       'this many tokens per layer (vanilla models; 0: the chunk-window '
                       'decoder; -1: exact within an imported checkpoint\'s context, else 0).')
  flags.DEFINE_bool('debug', False, 'Show the traceback of input errors.')


def read_prompt(prompt, prompt_file) -> str:
  """The prompt text of `--prompt` or `--prompt_file` (exactly one, non-empty, UTF-8)."""
  if (prompt is None) == (prompt_file is None):
    raise UserError('--prompt: give the text to continue with --prompt=TEXT or '
                    '--prompt_file=PATH (exactly one of them)')
  if prompt_file is not None:
    if not os.path.isfile(prompt_file):
      raise UserError(f'--prompt_file: no such file {prompt_file!r}')
    with open(prompt_file, 'rb') as f:
      data = f.read()
    try:
      prompt = data.decode('utf-8')
    except UnicodeDecodeError as error:
      raise UserError(f'--prompt_file: {prompt_file!r} is not UTF-8 text ({error.reason} at '
                      f'byte {error.start})') from None
  if not prompt:
    raise UserError(f'--{"prompt_file" if prompt_file is not None else "prompt"}: the prompt is '
                    'empty; give some text to continue')
  return prompt


def read_prompt_ids(prompt_ids, prompt_ids_file) -> list:
  """The ids of `--prompt_ids` or `--prompt_ids_file` (exactly one; non-negative integers)."""
  if (prompt_ids is None) == (prompt_ids_file is None):
    raise UserError('--prompt_ids: give --prompt_ids=1,2,3 or --prompt_ids_file=PATH '
                    '(exactly one of them)')
  name, text = '--prompt_ids', prompt_ids
  if prompt_ids_file is not None:
    name = '--prompt_ids_file'
    if not os.path.isfile(prompt_ids_file):
      raise UserError(f'--prompt_ids_file: no such file {prompt_ids_file!r}')
    with open(prompt_ids_file, encoding='utf-8', errors='replace') as f:
      text = f.read()
  words = text.replace(',', ' ').split()
  if not words:
    raise UserError(f'{name}: no ids; give at least one token id')
  for word in words:
    if not word.isdigit():
      raise UserError(f'{name}: {word!r} is not a token id (a non-negative integer)')
  return [int(word) for word in words]


def sampling_settings(temperature: float, top_k: int, top_p: float) -> SamplingSettings:
  try:
    return SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p).validate()
  except SamplingError as error:
    raise UserError(f'--{error}') from None


def check_generation_flags(max_new_tokens: int, stops) -> None:
  if max_new_tokens < 1:
    raise UserError(f'--max_new_tokens: {max_new_tokens} must be >= 1')
  if any(not stop for stop in stops):
    raise UserError('--stop: a stop string must not be empty')


def print_now(text: str) -> None:
  sys.stdout.write(text)
  sys.stdout.flush()


def main(argv):
  del argv
  show_own_info_only()
  overrides = [arg for arg in sys.argv[1:] if arg.startswith('--config')]
  if overrides:
    raise UserError(f'{overrides[0].split("=")[0]}: generate.py reads the model from the '
                    "run's config.json and takes no --config settings")
  ids_given = FLAGS.prompt_ids is not None or FLAGS.prompt_ids_file is not None
  if ids_given:
    if FLAGS.prompt is not None or FLAGS.prompt_file is not None:
      raise UserError('--prompt_ids: give either text (--prompt, --prompt_file) or ids '
                      '(--prompt_ids, --prompt_ids_file), not both')
    prompt = read_prompt_ids(FLAGS.prompt_ids, FLAGS.prompt_ids_file)
  else:
    prompt = read_prompt(FLAGS.prompt, FLAGS.prompt_file)
  settings = sampling_settings(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p)
  check_generation_flags(FLAGS.max_new_tokens, FLAGS.stop)
  decoder, tokenizer, _ = load_decoder(FLAGS.workdir, FLAGS.step, FLAGS.kv_cache)
  if ids_given:
    vocab = decoder.model_config.vocab_size
    bad = [i for i in prompt if i >= vocab]
    if bad:
      raise UserError(f'--prompt_ids: id {bad[0]} is not below the vocabulary size {vocab}')
  result = generate_text(decoder, tokenizer, prompt, settings=settings,
                         max_new_tokens=FLAGS.max_new_tokens, seed=FLAGS.seed, stops=FLAGS.stop,
                         write=(lambda piece: None) if ids_given else print_now)
  print_now(','.join(map(str, result.token_ids)) if ids_given else '')
  print_now('\n')


if __name__ == '__main__':
  define_flags()
  command_line.run(main)

"""`python -m longformer_jax.convert.hf --hf_dir=DIR --workdir=OUT [--dtype=...]`: a run workdir.

The workdir holds what a train.py run leaves: `config.json` (the complete
experiment config: the imported `model` section, `data.tokenizer='hf'` with
the directory's `tokenizer.json`, or 'sentencepiece' with its
`tokenizer.model` or `spiece.model`) and an Orbax checkpoint of step 0 that holds the parameters only,
in the checkpoint's own dtype (`Checkpointer.save_params`: no optimizer state,
memory or float32 copy, so the import needs about the checkpoint's size in host
memory; `data.chunk_len` at most the learned position table's rows), which
eval.py and generate.py read like any run's (cast to the model's float32), and
`import_config.py`, a config file that returns that `config.json`, so train.py
fine-tunes from it: `python train.py --config=OUT/import_config.py
--workdir=OUT [--config.train.num_steps=N ...]` (settings that change the
train state's shapes are refused, as for any resumed run; its first start builds
the optimizer state, and its first save writes a whole train state). `--dtype=bfloat16`
rounds float32 weights to bfloat16 and sets `model.dtype='bfloat16'` (the train state's
parameters are those values in float32, as every train state's are). Errors: one line,
exit status 2 (`command_line.py`).
"""

import json
import os
import time

from absl import app, flags
import flax.linen as nn
import jax
import ml_collections

from longformer_jax import command_line
from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import hf_source
from longformer_jax.convert import loader as hf
from longformer_jax.convert.errors import ConversionError
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.experiment_config import resolve_config, validate_config
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.storage import paths
from longformer_jax.tasks.registry import TASKS, task_for
from longformer_jax.train import initialization, run_directory

FLAGS = flags.FLAGS
DEFAULT_CHUNK_LEN = 256   # config.data.chunk_len's default
TRAIN_CONFIG_FILE = 'import_config.py'
# A config file for train.py (`--config=OUT/import_config.py`): the saved config.json.
TRAIN_CONFIG_SOURCE = '''"""The imported checkpoint's config (config.json beside this file), for train.py --config."""

import json
import os


def get_config():
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'config.json')) as f:
    return json.load(f)
'''


TASK_SEQ_LEN = 512        # examples of at most this many tokens (within the position table)
# Encoder families: the task's config (written as JSON inside a config file for train.py).
TASK_CONFIG_SOURCE = '''"""An imported checkpoint fine-tuned for a task (convert/hf_init.py).

  python train.py --config=THIS_FILE --workdir=RUN [--config.data.corpus=...]

Model settings must stay the checkpoint's; data, optimizer and train settings may change.
"""

import json

VALUES = json.loads(r"""
{values}
""")


def get_config():
  return json.loads(json.dumps(VALUES))
'''


IMPORT_FILE = 'hf_import.json'  # the checkpoint's context and config.json (generation/context.py)
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer.model', 'spiece.model')  # spiece: T5's


def tokenizer_settings(hf_dir: str, tokenizer_file: str, source_dir: str = '') -> dict:
  """`config.data` tokenizer keys for the checkpoint's own tokenizer: `tokenizer_file`, else
  the first of `TOKENIZER_FILES` in `hf_dir` (the local copy of `source_dir`, when given:
  the keys then name the file in `source_dir`)."""
  if tokenizer_file:
    if not paths.as_path(tokenizer_file).is_file():
      raise ConversionError(f'--tokenizer_file={tokenizer_file}: no such file')
    path = tokenizer_file if paths.is_remote(tokenizer_file) else os.path.abspath(tokenizer_file)
  else:
    found = [os.path.join(hf_dir, name) for name in TOKENIZER_FILES
             if os.path.isfile(os.path.join(hf_dir, name))]
    if not found:
      raise ConversionError(f'{source_dir or hf_dir}: no tokenizer ({", ".join(TOKENIZER_FILES)}); '
                            f'pass --tokenizer_file=PATH')
    path = hf_source.source_file(source_dir or hf_dir, hf_dir, found[0])
  if path.endswith('.json'):
    return {'tokenizer': 'hf', 'tokenizer_file': path}
  if path.endswith('.model'):
    return {'tokenizer': 'sentencepiece', 'sentencepiece_model': path}
  raise ConversionError(f'--tokenizer_file={tokenizer_file}: neither a tokenizer.json (.json) '
                        f'nor a SentencePiece model (.model)')


def write_task_config(hf_dir: str, source_dir: str, workdir: str, task: str, dtype: str,
                      tokenizer_file: str) -> None:
  """An encoder (Longformer: classification, qa) or encoder-decoder (LED: seq2seq):
  `workdir/import_config.py`, the task's config with the checkpoint's model settings and
  `train.init_from_hf` (convert/hf_init.py); train.py then fine-tunes in a run directory.
  The task adds its own settings (its `hf_settings`, tasks/)."""
  hf_config, settings = hf.model_settings(hf_dir)
  kind = 'encoder_decoder' if hf.is_encoder_decoder(hf_config) else 'encoder'
  fine_tuned = TASKS.get(task)
  if fine_tuned is None or fine_tuned.hf_checkpoint != kind:
    raise ConversionError(f'--task={task}: a {hf_config["model_type"]!r} checkpoint fine-tunes '
                          f'for task {" or ".join(tasks_taking(kind))} (pass --task=...; in '
                          f'Python: longformer_jax.convert.hf.load_model)')
  data = tokenizer_settings(hf_dir, tokenizer_file, source_dir)
  tokenizer = fine_tuned.tokenizer(ml_collections.ConfigDict(data))
  model = hf.checkpoint_model_values(settings, hf_config, dtype, tokenizer.vocab_size)
  model.pop('vocab_size', None)
  # Within a learned position table where the model has one (T5's relative buckets have none).
  data['seq_len'] = min(TASK_SEQ_LEN, settings.get('max_positions') or TASK_SEQ_LEN)
  fine_tuned.hf_settings(data, model, dict(settings, **hf.head_settings(hf_config)))
  values = {'task': task, 'model': model, 'data': data,
            'train': {'init_from_hf': recorded_dir(source_dir)}}
  tied = getattr(hf.family(hf_config), 'TIED_PARAMETERS', '')
  if tied:          # copies of a table the original shares stay equal (T5's position bias)
    values['optimizer'] = {'tied_parameters': tied}
  validate_config(ml_collections.ConfigDict(resolve_config(values)), jax.device_count())
  paths.write_text_atomically(
      paths.as_path(workdir) / TRAIN_CONFIG_FILE,
      TASK_CONFIG_SOURCE.format(values=json.dumps(values, indent=2, sort_keys=True)))


def tasks_taking(kind: str) -> tuple:
  """The tasks whose `hf_checkpoint` is `kind` ('decoder' | 'encoder' | 'encoder_decoder')."""
  return tuple(name for name, other in TASKS.items() if other.hf_checkpoint == kind)


def recorded_dir(hf_dir: str) -> str:
  """`hf_dir` as the run records it: a bucket path as given, a local one absolute."""
  return hf_dir if paths.is_remote(hf_dir) else os.path.abspath(hf_dir)


def convert_to_workdir(hf_dir: str, workdir: str, dtype: str = 'float32',
                       tokenizer_file: str = '', task: str = 'lm') -> dict | None:
  """Writes `workdir` (module docstring) from the Hugging Face checkpoint in `hf_dir`
  (a local or gs:// directory). Returns, for a decoder, the parameters' bytes and the
  seconds spent reading and converting them and writing the checkpoint (`phases`)."""
  with hf_source.local_hf_dir(hf_dir) as local_dir:
    return _convert(local_dir, hf_dir, workdir, dtype, tokenizer_file, task)


def phases(parameter_bytes: int, read_s: float, write_s: float) -> dict:
  return {'parameter_bytes': parameter_bytes, 'read_s': read_s, 'write_s': write_s}


def phases_line(times: dict) -> str:
  """`2.47 GB read and converted in 4.40 s (0.56 GB/s), written in 13.20 s (0.19 GB/s)`."""
  gb = times['parameter_bytes'] / 1e9
  return (f'{gb:.2f} GB read and converted in {times["read_s"]:.2f} s '
          f'({gb / max(times["read_s"], 1e-9):.2f} GB/s), written in {times["write_s"]:.2f} s '
          f'({gb / max(times["write_s"], 1e-9):.2f} GB/s)')


def _convert(hf_dir: str, source_dir: str, workdir: str, dtype: str, tokenizer_file: str,
             task: str) -> dict | None:
  """`convert_to_workdir` reading the files of `hf_dir`, the local copy of `source_dir`."""
  run_directory.check_workdir(workdir)
  if (paths.as_path(workdir) / 'checkpoints').is_dir():
    raise ConversionError(f'{workdir}: already holds checkpoints; pass a new --workdir')
  hf_config, settings = hf.model_settings(hf_dir)
  if hf.is_encoder(hf_config) or hf.is_encoder_decoder(hf_config):
    write_task_config(hf_dir, source_dir, workdir, task, dtype, tokenizer_file)
    return
  if getattr(TASKS.get(task), 'hf_checkpoint', '') != 'decoder':
    raise ConversionError(f'--task={task}: a {hf_config["model_type"]!r} checkpoint is a '
                          f'decoder; it imports for task {" or ".join(tasks_taking("decoder"))}')
  data = tokenizer_settings(hf_dir, tokenizer_file, source_dir)
  tokenizer = make_tokenizer(ml_collections.ConfigDict(data))
  model_values = hf.checkpoint_model_values(settings, hf_config, dtype, tokenizer.vocab_size)
  if settings.get('position_embedding') == 'learned':  # chunks within the learned table
    data['chunk_len'] = min(DEFAULT_CHUNK_LEN, settings['max_positions'])
  context = context_len(hf_config)
  # eval.py scores in chunks of the whole context: exact for documents up to it.
  values = {'task': task, 'model': model_values, 'data': data, 'eval': {'chunk_len': context}}
  config = ml_collections.ConfigDict(resolve_config(values))
  validate_config(config, jax.device_count())
  # numpy leaves in the checkpoint's own dtypes (--dtype=bfloat16 rounds float32 tensors),
  # read one tensor at a time: the import holds the parameters once, never a train state.
  start = time.perf_counter()
  params = hf.load_params(hf_dir, hf_config, settings, None if dtype == 'float32' else dtype)
  read_s = time.perf_counter() - start
  model = DecoderLM(lm_model_config(config.model, tokenizer.vocab_size))
  expected = jax.eval_shape(lambda: initialization.init_params(
      model, jax.random.PRNGKey(0), 1, config.data.chunk_len))
  expected = nn.meta.unbox(expected)
  if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(expected):
    raise ConversionError('the imported parameters do not match the model built from its '
                          'config (a mapping bug): ' + str(jax.tree_util.tree_structure(expected))[:200])
  for (path, new), old in zip(jax.tree_util.tree_leaves_with_path(params),
                              jax.tree_util.tree_leaves(expected)):
    if new.shape != old.shape:
      raise ConversionError(f'parameter {jax.tree_util.keystr(path)} has shape {new.shape}; '
                            f'the model expects {old.shape}')
  parameter_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(params))
  start = time.perf_counter()
  with Checkpointer(workdir, config.train.keep_checkpoints, async_save=False) as checkpointer:
    checkpointer.save_params(0, params, {'step': 0})
  write_s = time.perf_counter() - start
  del params
  run_directory.write_config(config, workdir)
  paths.write_text_atomically(paths.as_path(workdir) / TRAIN_CONFIG_FILE, TRAIN_CONFIG_SOURCE)
  paths.write_text_atomically(paths.as_path(workdir) / IMPORT_FILE, json.dumps(
      {'model_type': hf_config['model_type'], 'context_len': context,
       'hf_dir': recorded_dir(source_dir), 'dtype': dtype, 'hf_config': hf_config},
      indent=2, sort_keys=True))
  return phases(parameter_bytes, read_s, write_s)


def context_len(hf_config: dict) -> int:
  """The checkpoint's context: `max_position_embeddings` (GPT-2: `n_positions`)."""
  key = 'n_positions' if hf_config['model_type'] == 'gpt2' else 'max_position_embeddings'
  value = hf_config.get(key)
  if not isinstance(value, int) or value < 1:
    raise ConversionError(f'config.json: {key}={value!r} is not a positive number of tokens')
  return value


def define_flags() -> None:
  flags.DEFINE_string('hf_dir', None, 'Hugging Face model directory (config.json, *.safetensors).')
  flags.DEFINE_string('workdir', None, 'The run directory to write (new).')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Weights and compute dtype.')
  flags.DEFINE_string('tokenizer_file', '', 'tokenizer.json or .model (default: in --hf_dir).')
  flags.DEFINE_enum('task', 'lm', [name for name, other in TASKS.items() if other.hf_checkpoint],
                    'lm: a decoder workdir; classification / qa (Longformer), seq2seq (LED): '
                    'a config file for fine-tuning.')
  flags.DEFINE_bool('debug', False, 'Show the traceback of errors.')


def main(argv) -> None:
  del argv
  for name in ('hf_dir', 'workdir'):
    if not getattr(FLAGS, name):
      raise command_line.UserError(f'--{name} is required')
  times = convert_to_workdir(FLAGS.hf_dir, FLAGS.workdir, FLAGS.dtype, FLAGS.tokenizer_file,
                             FLAGS.task)
  if task_for(FLAGS.task).hf_checkpoint == 'decoder':
    print(f'wrote {FLAGS.workdir} (config.json, checkpoints/0): {phases_line(times)}')
  else:
    config_file = os.path.join(FLAGS.workdir, TRAIN_CONFIG_FILE)
    print(f'wrote {config_file}; fine-tune with: python train.py --config={config_file} '
          f'--workdir=RUN')


def run() -> None:
  """The entry point: one-line errors with exit status 2."""
  define_flags()

  def guarded(argv):
    try:
      main(argv)
    except (ConversionError, ConfigError, command_line.UserError, FileNotFoundError) as error:
      command_line.report_and_exit(error, FLAGS.debug)

  app.run(guarded)

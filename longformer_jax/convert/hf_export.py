"""Writing an imported model back as a Hugging Face model directory.

  python -m longformer_jax.convert.hf_export --workdir=RUN --out=DIR [--step=N]

`RUN` is a workdir that `python -m longformer_jax.convert.hf` wrote (GPT-2,
Llama, Mistral, Qwen2), perhaps fine-tuned since by train.py: its
`hf_import.json` holds the original config.json; or a train.py run of a
task fine-tuned from a T5, LED or Longformer checkpoint (`train.init_from_hf`,
convert/hf_init.py), whose original config.json is read there. Its
checkpoint (the latest, or `--step`) is restored as eval.py restores the
run's task. `DIR` gets `config.json` (the original's, `dtype` float32),
`model.safetensors` (float32, written from numpy with the `safetensors`
package; each tensor the inverse of the import's mapping, convert/gpt2.py
and convert/llama.py here, T5, LED and Longformer in convert/encoder_export.py,
so that importing `DIR` again gives the same parameters) and the tokenizer
files of the original directory (or the run's tokenizer file).
transformers loads `DIR` with `AutoModelForCausalLM.from_pretrained(DIR)`
(`AutoModelForSeq2SeqLM` for T5 and LED; for Longformer the class of its head,
`LongformerForMaskedLM`, or `LongformerForSequenceClassification` / `...ForQuestionAnswering`
for a run of task classification / qa, which the written `architectures` names).

Refused in one line (exit status 2): a missing workdir or `--out` that is
not empty, a workdir with neither `hf_import.json` nor `train.init_from_hf`
(not an imported model), a model type without an exporter (`EXPORTED`), a run
whose `config.json` no longer builds the model of the original config, and
parameters the original layout cannot hold (encoder_export.py).
"""

import json
import os
import shutil

from absl import app, flags
import jax
import numpy as np
from safetensors.numpy import save_file

from longformer_jax import command_line
from longformer_jax.checkpoint.resume_checks import CheckpointMismatchError
from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import encoder_export, hf_init, hf_source, loader
from longformer_jax.convert.encoder_export import linear_tensors
from longformer_jax.convert.errors import ConversionError
from longformer_jax.convert.hf_config import read_hf_config
from longformer_jax.convert.safetensors_reader import read_tensors
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.evaluation.run_restore import restore_params
from longformer_jax.evaluation.task_report import restore_task_state
from longformer_jax.experiment_config import validate_config
from longformer_jax.generation.saved_run import config_mismatch_message, run_config
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.tasks.registry import task_for

FLAGS = flags.FLAGS
IMPORT_FILE = 'hf_import.json'
DECODERS = ('gpt2', 'llama', 'mistral', 'qwen2')
# Every family written back: the decoders here, the encoder families in encoder_export.py.
EXPORTED = DECODERS + tuple(encoder_export.FAMILY_TENSORS)
# Tokenizer files of a Hugging Face directory, copied when the original directory has them.
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer.model', 'spiece.model', 'tokenizer_config.json',
                   'special_tokens_map.json', 'vocab.json', 'merges.txt', 'added_tokens.json',
                   'generation_config.json')


def read_import(workdir: str) -> dict:
  """The workdir's `hf_import.json`, checked; for a task run fine-tuned from a checkpoint
  (`train.init_from_hf` in its config.json), the same from that checkpoint's config.json."""
  if not os.path.isdir(workdir):
    raise ConversionError(f'--workdir: {workdir!r} is not a directory')
  path = os.path.join(workdir, IMPORT_FILE)
  if not os.path.isfile(path):
    return fine_tuned_import(workdir)
  try:
    with open(path) as f:
      info = json.load(f)
  except json.JSONDecodeError as error:
    raise ConversionError(f'{path}: not valid JSON ({error})') from None
  hf_config = info.get('hf_config') if isinstance(info, dict) else None
  if not isinstance(hf_config, dict) or 'model_type' not in hf_config:
    raise ConversionError(f'{path}: no hf_config with a model_type')
  if hf_config['model_type'] not in EXPORTED:
    raise ConversionError(f'{path}: model_type {hf_config["model_type"]!r} has no exporter '
                          f'(supported: {", ".join(EXPORTED)})')
  return info


def fine_tuned_import(workdir: str) -> dict:
  """`{'hf_config', 'hf_dir'}` of the checkpoint the run in `workdir` fine-tunes
  (`train.init_from_hf`, convert/hf_init.py)."""
  path = os.path.join(workdir, 'config.json')
  hf_dir = ''
  if os.path.isfile(path):
    with open(path) as f:
      hf_dir = (json.load(f).get('train') or {}).get('init_from_hf') or ''
  if not hf_dir:
    raise ConversionError(f'--workdir: {workdir!r} has no {IMPORT_FILE} and its config.json no '
                          f'train.init_from_hf: not a model imported with '
                          f'python -m longformer_jax.convert.hf')
  with hf_source.local_hf_dir(hf_dir, only=('config.json',)) as local_dir:
    hf_config = read_hf_config(local_dir)
  if hf_config.get('model_type') not in EXPORTED:
    raise ConversionError(f'{hf_dir}: model_type {hf_config.get("model_type")!r} has no '
                          f'exporter (supported: {", ".join(EXPORTED)})')
  return {'hf_config': hf_config, 'hf_dir': hf_dir}


def gpt2_tensors(params: dict, settings: dict) -> dict:
  """Inverse of convert/gpt2.py: `transformer.*` tensors (the output stays tied to wte)."""
  d = settings['d_model']
  out = {'transformer.wte.weight': params['embedding']['embedding'],
         'transformer.wpe.weight': params['position_embedding']['embedding'],
         'transformer.ln_f.weight': params['final_norm']['scale'],
         'transformer.ln_f.bias': params['final_norm']['bias']}
  for layer in range(settings['num_layers']):
    block, h = params['blocks'][f'layer_{layer}'], f'transformer.h.{layer}.'
    attention = block['attention']
    names = ('query', 'key', 'value')
    out[f'{h}attn.c_attn.weight'] = np.concatenate(
        [attention[n]['kernel'].reshape(d, d) for n in names], axis=1)
    out[f'{h}attn.c_attn.bias'] = np.concatenate(
        [attention[n]['bias'].reshape(d) for n in names])
    out[f'{h}attn.c_proj.weight'] = attention['out']['kernel'].reshape(d, d)
    out[f'{h}attn.c_proj.bias'] = attention['out']['bias']
    for ours, theirs in (('attention_norm', 'ln_1'), ('feed_forward_norm', 'ln_2')):
      out[f'{h}{theirs}.weight'] = block[ours]['scale']
      out[f'{h}{theirs}.bias'] = block[ours]['bias']
    for ours, theirs in (('wi', 'c_fc'), ('wo', 'c_proj')):
      out[f'{h}mlp.{theirs}.weight'] = block['feed_forward'][ours]['kernel']
      out[f'{h}mlp.{theirs}.bias'] = block['feed_forward'][ours]['bias']
  return out


def llama_tensors(params: dict, settings: dict) -> dict:
  """Inverse of convert/llama.py (Llama, Mistral, Qwen2)."""
  d, d_ff = settings['d_model'], settings['d_ff']
  out = {'model.embed_tokens.weight': params['embedding']['embedding'],
         'model.norm.weight': params['final_norm']['scale']}
  if not settings['tie_embeddings']:
    out['lm_head.weight'] = params['embedding']['output']['kernel'].T
  for layer in range(settings['num_layers']):
    block, pre = params['blocks'][f'layer_{layer}'], f'model.layers.{layer}.'
    attention = block['attention']
    for ours, theirs in (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj')):
      linear_tensors(out, f'{pre}self_attn.{theirs}', attention[ours], d)
    o_proj = attention['out']
    out[f'{pre}self_attn.o_proj.weight'] = o_proj['kernel'].reshape(-1, d).T
    if 'bias' in o_proj:
      out[f'{pre}self_attn.o_proj.bias'] = o_proj['bias']
    out[f'{pre}input_layernorm.weight'] = block['attention_norm']['scale']
    out[f'{pre}post_attention_layernorm.weight'] = block['feed_forward_norm']['scale']
    ff = block['feed_forward']
    linear_tensors(out, f'{pre}mlp.gate_proj', ff['wi'], d)
    linear_tensors(out, f'{pre}mlp.up_proj', ff['wi_up'], d)
    linear_tensors(out, f'{pre}mlp.down_proj', ff['wo'], d_ff)
  return out


def export_tensors(params: dict, hf_config: dict, original: dict | None = None) -> dict:
  """The Hugging Face tensors (float32 numpy, contiguous) of `params`; `original`: the
  original checkpoint's tensors the import folds or drops (encoder_export.ORIGINAL_TENSORS)."""
  model_type = hf_config['model_type']
  settings = loader.family(hf_config).model_settings(hf_config)
  params = _numpy(params)
  if model_type in encoder_export.FAMILY_TENSORS:
    tensors = encoder_export.FAMILY_TENSORS[model_type](params, settings, hf_config,
                                                        original or {})
  else:
    tensors = (gpt2_tensors if model_type == 'gpt2' else llama_tensors)(params, settings)
  return {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}


def _numpy(tree):
  if isinstance(tree, dict):
    return {k: _numpy(v) for k, v in tree.items()}
  return np.asarray(tree, np.float32)


def restore_run(workdir: str, step: int = -1) -> tuple:
  """`(config, params)`: the run's config.json and its checkpoint's parameters (numpy),
  restored as eval.py restores the run's task (a language model's chunks, or a task's
  examples: the task's model and the shapes of its `eval.split`)."""
  config = run_config(workdir, step)
  validate_config(config, jax.device_count())
  task = task_for(config.task)
  mesh = make_mesh(config.parallel.mesh_shape)
  try:
    if task.carries_memory:              # lm: as eval.py restores a language model
      params, _, _, _ = restore_params(config, make_tokenizer(config.data), workdir,
                                                   mesh, config.parallel.logical_axis_rules)
    else:                                # fixed-size examples: through the task
      arrays = task.load_arrays(config, config.eval.split, task.tokenizer(config.data))
      params = restore_task_state(config, workdir, task, arrays, mesh)[2].params
  except CheckpointMismatchError as error:
    raise ConversionError(config_mismatch_message(workdir, error)) from None
  return config, jax.device_get(params)


def check_same_model(config, hf_config: dict) -> None:
  """The run's `config.model` must hold the settings the original config.json maps to (but
  those fine-tuning may change: hf_init.FREE_SETTINGS, dropout and Longformer's global tokens)."""
  settings = loader.family(hf_config).model_settings(hf_config)
  for key, value in sorted(settings.items()):
    ours = config.model.get(key)
    ours = ours.to_dict() if hasattr(ours, 'to_dict') else ours
    if isinstance(value, dict) and isinstance(ours, dict):   # a section: its imported keys
      value = {k: v for k, v in value.items() if f'{key}.{k}' not in hf_init.FREE_SETTINGS}
      ours = {k: ours.get(k) for k in value}
    if key not in hf_init.FREE_SETTINGS and ours != value:
      raise ConversionError(f'config.json: model.{key}={ours!r} differs from the imported '
                            f'checkpoint\'s {value!r} ({IMPORT_FILE}); cannot write it back')


def original_tensors(info: dict) -> dict:
  """The original checkpoint's tensors that the import folds or drops
  (encoder_export.ORIGINAL_TENSORS), when its directory is at hand; else {}."""
  names = encoder_export.ORIGINAL_TENSORS.get(info['hf_config']['model_type'], ())
  if not names or not info.get('hf_dir'):
    return {}
  try:
    with hf_source.local_hf_dir(info['hf_dir']) as local_dir:
      return read_tensors(local_dir, names=names)
  except (ConversionError, OSError):
    return {}


def tokenizer_sources(config, info: dict) -> list:
  """The tokenizer files to copy: the original directory's, else the run's tokenizer file."""
  hf_dir = info.get('hf_dir') or ''
  found = [os.path.join(hf_dir, name) for name in TOKENIZER_FILES
           if hf_dir and os.path.isfile(os.path.join(hf_dir, name))]
  if found:
    return found
  run_file = config.data.get('tokenizer_file') or config.data.get('sentencepiece_model')
  return [run_file] if run_file and os.path.isfile(run_file) else []


def export(workdir: str, out: str, step: int = -1) -> list:
  """Writes `out` (module doc); returns the names of the files written."""
  info = read_import(workdir)
  hf_config = dict(info['hf_config'])
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ConversionError(f'--out: {out!r} exists and is not an empty directory')
  config, params = restore_run(workdir, step)
  check_same_model(config, hf_config)
  tensors = export_tensors(params, hf_config, original_tensors(info))
  os.makedirs(out, exist_ok=True)
  save_file(tensors, os.path.join(out, 'model.safetensors'), metadata={'format': 'pt'})
  hf_config = encoder_export.exported_config(hf_config, params)   # Longformer: its head
  hf_config['dtype'] = 'float32'
  hf_config.pop('torch_dtype', None)
  with open(os.path.join(out, 'config.json'), 'w') as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  written = ['config.json', 'model.safetensors']
  for source in tokenizer_sources(config, info):
    shutil.copy(source, out)
    written.append(os.path.basename(source))
  return written


def main(argv) -> None:
  del argv
  for name in ('workdir', 'out'):
    if not getattr(FLAGS, name):
      raise command_line.UserError(f'--{name} is required')
  written = export(FLAGS.workdir, FLAGS.out, FLAGS.step)
  print(f'wrote {FLAGS.out} ({", ".join(written)})')


def run() -> None:
  flags.DEFINE_string('workdir', None, 'A workdir written by python -m longformer_jax.convert.hf.')
  flags.DEFINE_string('out', None, 'The Hugging Face directory to write (new or empty).')
  flags.DEFINE_integer('step', -1, 'Checkpoint step to export (-1: the latest).')
  flags.DEFINE_bool('debug', False, 'Show the traceback of errors.')

  def guarded(argv):
    try:
      main(argv)
    except (ConversionError, ConfigError, command_line.UserError,
            FileNotFoundError) as error:
      command_line.report_and_exit(error, FLAGS.debug)

  app.run(guarded)


if __name__ == '__main__':
  run()

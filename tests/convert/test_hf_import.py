"""Importing Hugging Face checkpoints (longformer_jax/convert): logits, workdir, errors.

The references are transformers' own float32 logits of tiny random models
(`tests/data/hf/<name>/logits.npy`, written by tools/make_hf_fixtures.py):
GPT-2 (learned positions, biases, LayerNorm, GELU, tied output), Llama
(grouped-query attention, llama3 rope scaling, RMSNorm, SwiGLU, untied), Mistral
(one key/value head, linear rope scaling) and
Qwen2 (q/k/v biases, tied). Row 1 of the inputs is right-padded; only its
valid positions are compared. Needs numpy, safetensors and tokenizers only.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from longformer_jax.attention.context import AttentionContext
from longformer_jax.convert import hf
from longformer_jax.models.decoder_lm import DecoderLM
from tests.support.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import
from tests.support.hf_checkpoints import conversion_error, edited_copy
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf')
FAMILIES = ('gpt2', 'llama', 'mistral', 'qwen2')


def fixture(name: str, file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, name, file))


def our_logits(model_config, params, input_ids, mask) -> np.ndarray:
  batch, length = input_ids.shape
  ctx = AttentionContext(positions=jnp.tile(jnp.arange(length), (batch, 1)),
                         segment_ids=jnp.zeros((batch, length), jnp.int32),
                         reset=jnp.ones((batch,), bool), valid=jnp.asarray(mask, bool))
  params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)
  logits, _, _ = DecoderLM(model_config).apply(
      {'params': params}, jnp.asarray(input_ids), DecoderLM.init_state(model_config, batch), ctx)
  return np.asarray(logits)


def assert_matches_reference(name: str, logits: np.ndarray, rtol: float = 1e-4) -> None:
  reference = fixture(name, 'logits.npy')
  valid = fixture(name, 'attention_mask.npy').astype(bool)
  assert logits.shape == reference.shape
  scale = np.abs(reference[valid]).max()
  np.testing.assert_allclose(logits[valid], reference[valid], rtol=0, atol=rtol * scale)


@pytest.mark.parametrize('name', FAMILIES)
def test_logits_match_transformers(name):
  model_config, params = hf.load(os.path.join(DATA, name))
  logits = our_logits(model_config, params, fixture(name, 'input_ids.npy'),
                      fixture(name, 'attention_mask.npy'))
  assert_matches_reference(name, logits)


def test_llama_uses_its_features():
  model_config, _ = hf.load(os.path.join(DATA, 'llama'))
  assert model_config.num_kv_heads == 2 and model_config.num_heads == 4
  assert model_config.rope_scaling['type'] == 'llama3'
  assert model_config.norm == 'rms_norm' and model_config.ff_activation == 'swiglu'
  assert not model_config.tie_embeddings


def test_bfloat16_keeps_bfloat16_and_stays_close():
  model_config, params = hf.load(os.path.join(DATA, 'gpt2'), dtype='bfloat16')
  assert all(leaf.dtype.name == 'bfloat16' for leaf in jax.tree_util.tree_leaves(params))
  assert model_config.dtype == 'bfloat16'
  logits = our_logits(model_config, params, fixture('gpt2', 'input_ids.npy'),
                      fixture('gpt2', 'attention_mask.npy'))
  assert_matches_reference('gpt2', logits, rtol=0.1)


def test_sharded_checkpoint_reads_like_single_file(tmp_path):
  source = os.path.join(DATA, 'qwen2')
  tensors = load_file(os.path.join(source, 'model.safetensors'))
  names = sorted(tensors)
  shards = {'model-00001-of-00002.safetensors': names[:len(names) // 2],
            'model-00002-of-00002.safetensors': names[len(names) // 2:]}
  for file, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
  with open(tmp_path / 'model.safetensors.index.json', 'w') as f:
    json.dump({'weight_map': {k: file for file, keys in shards.items() for k in keys}}, f)
  shutil.copy(os.path.join(source, 'config.json'), tmp_path)
  model_config, params = hf.load(str(tmp_path))
  assert_matches_reference('qwen2', our_logits(model_config, params,
                                               fixture('qwen2', 'input_ids.npy'),
                                               fixture('qwen2', 'attention_mask.npy')))


# ---- errors: one line naming the culprit -------------------------------------------------

def test_missing_tensor_is_named(tmp_path):
  name = 'model.layers.1.mlp.up_proj.weight'
  message = conversion_error(edited_copy(f'{DATA}/llama', tmp_path, lambda t: t.pop(name)))
  assert 'missing tensor' in message and name in message


def test_unexpected_tensor_is_named(tmp_path):
  def add(tensors):
    tensors['model.layers.0.extra.weight'] = np.zeros((2,), np.float32)
  message = conversion_error(edited_copy(f'{DATA}/llama', tmp_path, add))
  assert 'unexpected tensor' in message and 'model.layers.0.extra.weight' in message


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
  name = 'transformer.h.0.mlp.c_fc.bias'
  def shrink(tensors):
    tensors[name] = tensors[name][:100]
  message = conversion_error(edited_copy(f'{DATA}/gpt2', tmp_path, shrink))
  assert name in message and '(100,)' in message and '(128,)' in message


def test_unknown_model_type_is_named(tmp_path):
  message = conversion_error(edited_copy(f'{DATA}/gpt2', tmp_path,
                                 edit_config=lambda c: c.update(model_type='falcon')))
  assert "'falcon'" in message


def test_missing_files_are_named(tmp_path):
  assert 'config.json' in conversion_error(str(tmp_path))
  shutil.copy(os.path.join(DATA, 'gpt2', 'config.json'), tmp_path)
  assert 'no weights file' in conversion_error(str(tmp_path))


# ---- the command line and its workdir ----------------------------------------------------

@pytest.fixture(scope='module')
def llama_workdir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run') / 'llama')
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={DATA}/llama',
       f'--workdir={workdir}'], cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  return workdir


def test_cli_workdir_restores_to_the_same_logits(llama_workdir):
  sys.path.insert(0, REPO)
  import generate  # pylint: disable=g-import-not-at-top
  import eval as eval_script  # pylint: disable=g-import-not-at-top
  from longformer_jax.data.tokenizers import make_tokenizer  # pylint: disable=g-import-not-at-top
  from longformer_jax.models.resolved_model import lm_model_config  # pylint: disable=g-import-not-at-top
  from longformer_jax.parallel.mesh import make_mesh  # pylint: disable=g-import-not-at-top
  config = generate.run_config(llama_workdir, -1)
  tokenizer = make_tokenizer(config.data)
  assert config.data.tokenizer == 'hf' and tokenizer.vocab_size == 96
  params, _, step, _ = eval_script.restore_params(
      config, tokenizer, llama_workdir, make_mesh(config.parallel.mesh_shape),
      config.parallel.logical_axis_rules)
  assert step == 0
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  logits = our_logits(model_config, jax.device_get(params), fixture('llama', 'input_ids.npy'),
                      fixture('llama', 'attention_mask.npy'))
  assert_matches_reference('llama', logits)


@pytest.mark.slow
def test_eval_sweeps_memories_on_the_imported_workdir(llama_workdir, tmp_path):
  """eval.py scores the imported model with eval-time memories (docs/import.md)."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(llama_workdir, workdir)
  result = subprocess.run(
      [sys.executable, 'eval.py', f'--workdir={workdir}', '--config.eval.chunk_len=8',
       '--config.eval.max_tokens=256',
       "--config.eval.memory_sweep=variant=attendre,vanilla;policy=fifo;memory_size=0,16"],
      cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  with open(os.path.join(workdir, 'eval', 'memory_sweep.json')) as f:
    rows = {(row['variant'], row['memory_size']): row for row in json.load(f)}
  assert set(rows) == {('attendre', 0), ('attendre', 16), ('vanilla', 0), ('vanilla', 16)}
  assert all(np.isfinite(row['perplexity']) for row in rows.values())
  # A FIFO of 16 keys and values sees what a cache of 16 hidden states sees (the two
  # paths agree); a memory changes the scores.
  for size in (0, 16):
    assert rows['attendre', size]['loss'] == pytest.approx(rows['vanilla', size]['loss'],
                                                           rel=1e-5)
  assert rows['attendre', 16]['loss'] != rows['attendre', 0]['loss']


def test_passkey_grid_runs_on_the_imported_workdir(llama_workdir, tmp_path):
  """The passkey evaluation (docs/passkey.md) reads an imported model like a trained one."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(llama_workdir, workdir)
  result = subprocess.run(
      [sys.executable, 'eval.py', f'--workdir={workdir}', '--config.eval.chunk_len=16',
       '--config.eval.passkey_grid=lengths=64;depths=0,100;documents=1;'
       'memories=none,attendre_fifo;memory_size=16'],
      cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  written = set(os.listdir(os.path.join(workdir, 'eval')))
  assert 'passkey_grid.json' in written and any(f.endswith('.png') for f in written)


@pytest.mark.slow
def test_generate_with_a_kv_cache_gives_the_chunk_window_text(llama_workdir):
  """generate.py on the imported workdir, greedy: the key/value cache (one token per step)
  and the chunk-window decoder write the same text while it fits in both."""
  outputs = []
  for extra in (['--kv_cache=0'], ['--kv_cache=64']):
    result = subprocess.run(
        [sys.executable, 'generate.py', f'--workdir={llama_workdir}', '--prompt=w5 w6 w7',
         '--max_new_tokens=8', '--temperature=0'] + extra,
        cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    outputs.append(result.stdout)
  assert outputs[0] == outputs[1] and len(outputs[0].split()) == 8


@pytest.mark.slow
def test_train_fine_tunes_from_the_cli_workdir(llama_workdir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(llama_workdir, workdir)
  result = subprocess.run(
      [sys.executable, 'train.py', f'--config={workdir}/import_config.py', f'--workdir={workdir}',
       '--config.train.num_steps=1', '--config.data.skip_undecodable=True'],
      cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'Resumed from step 0' in result.stderr
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['0', '1']


def test_cli_error_is_one_line_with_status_2(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={tmp_path}',
       f'--workdir={tmp_path}/out'], cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and 'config.json' in lines[-1]
  assert 'Traceback' not in result.stderr


# ---- the tokenizer and the model settings ------------------------------------------------

def test_hf_tokenizer_round_trip_and_special_ids():
  from longformer_jax.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
  tokenizer = HfTokenizer.load(os.path.join(DATA, 'gpt2', 'tokenizer.json'))
  assert (tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (
      96, 0, 1, 2)
  ids = tokenizer.encode('w5 w17 w95')
  assert ids.tolist() == [5, 17, 95] and ids.dtype == np.int32
  assert tokenizer.decode([1, 5, 17, 95, 2, 0]) == 'w5 w17 w95'
  assert tokenizer.token_byte_lengths()[17] == 3


def test_hf_tokenizer_errors_name_the_key(tmp_path):
  from longformer_jax.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from longformer_jax.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match='data.tokenizer_file'):
    HfTokenizer.load(str(tmp_path / 'missing.json'))


@pytest.mark.parametrize('values, key', [
    ({'num_kv_heads': 3}, 'num_kv_heads'),
    ({'attention': 'xl', 'qkv_bias': True}, 'qkv_bias'),
    ({'attention': 'longformer', 'num_kv_heads': 2}, 'num_kv_heads'),
    ({'block': 'gtrxl', 'norm': 'rms_norm'}, 'norm'),
    ({'ff_activation': 'gelu_erf'}, 'ff_activation'),
    ({'rope_scaling': {'type': 'dynamic', 'factor': 2.0}}, 'rope_scaling'),
    ({'rope_scaling': {'type': 'llama3', 'factor': 8.0}}, 'rope_scaling'),
    ({'position_embedding': 'learned'}, 'max_positions'),
    ({'ff_activation': 'tanh'}, 'ff_activation'),
    ({'norm': 'batch_norm'}, 'norm'),
    ({'norm_epsilon': 0.0}, 'norm_epsilon'),
])
def test_bad_import_settings_name_their_key(values, key):
  from longformer_jax.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from longformer_jax.models.model_config import resolve_model  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=f'model.{key}'):
    resolve_model(values)


def test_learned_positions_must_cover_the_chunks():
  from longformer_jax.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from longformer_jax.models.model_config import resolve_model  # pylint: disable=g-import-not-at-top
  values = {'position_embedding': 'learned', 'max_positions': 32}
  resolve_model(values, chunk_lens=(32,))
  with pytest.raises(ConfigError, match='model.max_positions'):
    resolve_model(values, chunk_lens=(32, 64))


def test_rotary_scaling_against_a_plain_loop():
  """llama3 frequencies, written out per frequency (Llama 3.1's published rule)."""
  import math  # pylint: disable=g-import-not-at-top
  from longformer_jax.layers.positional import rotary_inv_freq  # pylint: disable=g-import-not-at-top
  scaling = {'type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
             'original_max_position_embeddings': 64}
  head_dim, theta = 16, 10000.0
  expected = []
  for i in range(head_dim // 2):
    freq = theta ** (-2 * i / head_dim)
    wavelen = 2 * math.pi / freq
    if wavelen < 64 / 4.0:
      expected.append(freq)
    elif wavelen > 64 / 1.0:
      expected.append(freq / 8.0)
    else:
      smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
      expected.append((1 - smooth) * freq / 8.0 + smooth * freq)
  np.testing.assert_allclose(rotary_inv_freq(head_dim, theta, scaling), expected, rtol=1e-5)
  np.testing.assert_allclose(rotary_inv_freq(head_dim, theta, {'type': 'linear', 'factor': 4.0}),
                             rotary_inv_freq(head_dim, theta) / 4.0, rtol=1e-6)


def test_bfloat16_tensors_are_read_without_torch(tmp_path):
  """A file holding a BF16 tensor after an F32 one, in the safetensors layout."""
  import struct  # pylint: disable=g-import-not-at-top
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  from longformer_jax.convert.safetensors_reader import read_tensors  # pylint: disable=g-import-not-at-top
  first = np.arange(3, dtype=np.float32)
  second = (np.arange(6, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16).reshape(2, 3)
  header = {'a': {'dtype': 'F32', 'shape': [3], 'data_offsets': [0, 12]},
            'b': {'dtype': 'BF16', 'shape': [2, 3], 'data_offsets': [12, 24]}}
  encoded = json.dumps(header).encode()
  with open(tmp_path / 'model.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(encoded)) + encoded + first.tobytes() + second.tobytes())
  tensors = read_tensors(str(tmp_path), 'bfloat16')
  assert tensors['b'].dtype == ml_dtypes.bfloat16 and tensors['a'].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(tensors['b'], second)
  as_float = read_tensors(str(tmp_path), 'float32')
  np.testing.assert_array_equal(as_float['a'], first)
  np.testing.assert_array_equal(as_float['b'], second.astype(np.float32))


def test_byte_level_bpe_counts_bytes_exactly(tmp_path):
  """GPT-2-style byte-level BPE: token bytes add up to the text's UTF-8 length."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from longformer_jax.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  text = 'héllo wörld, the quick brown fox jumps over the lazy dog ✓'
  bpe.train_from_iterator([text] * 20, tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=['<|endoftext|>'],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  bpe.save(str(tmp_path / 'tokenizer.json'))
  tokenizer = HfTokenizer.load(str(tmp_path / 'tokenizer.json'))
  ids = tokenizer.encode(text)
  assert tokenizer.bos_id == tokenizer.eos_id == tokenizer.pad_id == 0
  assert tokenizer.decode(ids) == text
  assert tokenizer.token_byte_lengths()[ids].sum() == len(text.encode('utf-8'))
  assert tokenizer.token_byte_lengths()[0] == 0


def test_a_checkpoint_in_a_bucket_imports_into_a_gs_workdir(gcs_bucket):
  """`--hf_dir` and `--workdir` in a bucket (the local GCS server): the run restores to the
  reference logits, and its tokenizer and hf_dir are the bucket's."""
  sys.path.insert(0, REPO)
  import eval as eval_script  # pylint: disable=g-import-not-at-top
  import generate  # pylint: disable=g-import-not-at-top
  from longformer_jax.convert.workdir_cli import convert_to_workdir  # pylint: disable=g-import-not-at-top
  from longformer_jax.data.tokenizers import make_tokenizer  # pylint: disable=g-import-not-at-top
  from longformer_jax.models.resolved_model import lm_model_config  # pylint: disable=g-import-not-at-top
  from longformer_jax.parallel.mesh import make_mesh  # pylint: disable=g-import-not-at-top
  from longformer_jax.storage import paths  # pylint: disable=g-import-not-at-top
  hf_dir, workdir = f'{gcs_bucket}/hf/llama', f'{gcs_bucket}/imported/llama'
  for name in os.listdir(f'{DATA}/llama'):
    with open(f'{DATA}/llama/{name}', 'rb') as f:
      paths.as_path(f'{hf_dir}/{name}').write_bytes(f.read())
  convert_to_workdir(hf_dir, workdir)
  record = json.loads((paths.as_path(workdir) / 'hf_import.json').read_text())
  assert record['hf_dir'] == hf_dir
  config = generate.run_config(workdir, -1)
  assert config.data.tokenizer_file == f'{hf_dir}/tokenizer.json'
  tokenizer = make_tokenizer(config.data)
  params, _, step, _ = eval_script.restore_params(
      config, tokenizer, workdir, make_mesh(config.parallel.mesh_shape),
      config.parallel.logical_axis_rules)
  assert step == 0
  logits = our_logits(lm_model_config(config.model, tokenizer.vocab_size),
                      jax.device_get(params), fixture('llama', 'input_ids.npy'),
                      fixture('llama', 'attention_mask.npy'))
  assert_matches_reference('llama', logits)

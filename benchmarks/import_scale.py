"""Importing checkpoints of real sizes: wall time, peak host memory, read rate, decode rate.

  python benchmarks/import_scale.py --size=1b [--dir=/tmp/import_scale] [--decode]
  python benchmarks/import_scale.py --size=7b --memory_limit_gib=20

Builds a random checkpoint with the real shapes of Llama-3.2-1B (1.24B
parameters, tied embeddings, 2.47 GB in bfloat16) or of a 7B Mistral (7.24B,
14.5 GB), written straight from numpy in bfloat16 as safetensors shards of at
most 2 GB with a `model.safetensors.index.json` (no torch), and a small
tokenizer (the tiny Llama fixture's). Then, each in a child process:

- the disk's sequential read rate: the shards read once with the page cache
  dropped first (`posix_fadvise(DONTNEED)` after `fsync`), in 64 MiB reads;
- the disk's sequential write rate: 1 GiB written in 64 MiB writes, fsync
  included (the import writes as many bytes as it reads);
- the import, `python -m longformer_jax.convert.hf --hf_dir=... --workdir=...`
  with the page cache dropped again: wall seconds, the child's peak resident
  memory (`ru_maxrss` of the waited child, and a 0.2 s poll of its RSS that
  stops it above `--memory_limit_gib`), the checkpoint's bytes over the wall
  time, and its peak over the checkpoint's size (the target is 1.3x); from
  the import's own last line, the seconds reading + converting and writing,
  each over the disk's rate for that direction;
- with `--decode` (the 1B): greedy decoding with the key/value cache,
  `generate.py --prompt_ids=... --temperature=0 --kv_cache=...` for two
  lengths of new tokens; tokens/s is the difference in tokens over the
  difference in wall time (restore and compilation cancel out).

One JSON line per measurement, and a summary line.
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time

import ml_dtypes
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, 'tests', 'data', 'hf', 'llama', 'tokenizer.json')
SHARD_BYTES = 2 * 10 ** 9
READ_CHUNK = 64 * 2 ** 20
END_TOKENS = (1, 2)            # the tokenizer's BOS and EOS (generation stops at either)

SIZES = {
    '1b': dict(model_type='llama', architectures=['LlamaForCausalLM'], vocab_size=128256,
               hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5,
               rope_parameters=dict(rope_type='llama3', rope_theta=500000.0, factor=32.0,
                                    low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192)),
    '7b': dict(model_type='mistral', architectures=['MistralForCausalLM'], vocab_size=32000,
               hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=False, max_position_embeddings=32768, rms_norm_eps=1e-5,
               sliding_window=None, rope_parameters=dict(rope_type='default',
                                                         rope_theta=1000000.0)),
    # The same layout at a size that builds in seconds (a check of this script).
    'small': dict(model_type='llama', architectures=['LlamaForCausalLM'], vocab_size=32000,
                  hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  tie_word_embeddings=True, max_position_embeddings=2048, rms_norm_eps=1e-5,
                  rope_parameters=dict(rope_type='default', rope_theta=10000.0)),
}


def tensor_shapes(c: dict) -> dict:
  """Hugging Face tensor name -> shape, for a Llama / Mistral config."""
  d, f, hd = c['hidden_size'], c['intermediate_size'], c['head_dim']
  q, kv = c['num_attention_heads'] * hd, c['num_key_value_heads'] * hd
  shapes = {'model.embed_tokens.weight': (c['vocab_size'], d), 'model.norm.weight': (d,)}
  if not c['tie_word_embeddings']:
    shapes['lm_head.weight'] = (c['vocab_size'], d)
  for layer in range(c['num_hidden_layers']):
    pre = f'model.layers.{layer}.'
    shapes.update({
        pre + 'input_layernorm.weight': (d,), pre + 'post_attention_layernorm.weight': (d,),
        pre + 'self_attn.q_proj.weight': (q, d), pre + 'self_attn.k_proj.weight': (kv, d),
        pre + 'self_attn.v_proj.weight': (kv, d), pre + 'self_attn.o_proj.weight': (d, q),
        pre + 'mlp.gate_proj.weight': (f, d), pre + 'mlp.up_proj.weight': (f, d),
        pre + 'mlp.down_proj.weight': (d, f)})
  return shapes


def write_shard(path: str, tensors: list, rng: np.random.Generator, output_table: str) -> None:
  """A safetensors file of bfloat16 tensors `[(name, shape)]`, values N(0, 0.02) (norms 1;
  the `END_TOKENS` rows of `output_table` 0), written tensor by tensor: an 8-byte header
  length, the JSON header, then the data."""
  header, offset = {'__metadata__': {'format': 'pt'}}, 0
  for name, shape in tensors:
    size = int(np.prod(shape)) * 2
    header[name] = {'dtype': 'BF16', 'shape': list(shape), 'data_offsets': [offset, offset + size]}
    offset += size
  encoded = json.dumps(header, separators=(',', ':')).encode()
  encoded += b' ' * (-len(encoded) % 8)
  with open(path, 'wb') as f:
    f.write(len(encoded).to_bytes(8, 'little'))
    f.write(encoded)
    for name, shape in tensors:
      if name.endswith('norm.weight'):
        values = np.ones(shape, ml_dtypes.bfloat16)
      else:
        values = (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
      if name == output_table:          # logit 0 for BOS and EOS: among ~95 random logits
        values[list(END_TOKENS)] = 0    # greedy decoding never picks them, never stops early
      f.write(values.tobytes())
    f.flush()
    os.fsync(f.fileno())


def build_checkpoint(size: str, hf_dir: str) -> int:
  """Writes the random checkpoint of `size` into `hf_dir`; returns its tensor bytes."""
  config = dict(SIZES[size], bos_token_id=1, eos_token_id=2, hidden_act='silu', dtype='bfloat16')
  if config['model_type'] == 'llama':          # fields Mistral's config.json does not have
    config.update(attention_bias=False, mlp_bias=False)
  os.makedirs(hf_dir, exist_ok=True)
  with open(os.path.join(hf_dir, 'config.json'), 'w') as f:
    json.dump(config, f, indent=1)
  shutil.copy(TOKENIZER, hf_dir)
  shards, current, current_bytes = [], [], 0
  for name, shape in tensor_shapes(config).items():
    size_bytes = int(np.prod(shape)) * 2
    if current and current_bytes + size_bytes > SHARD_BYTES:
      shards.append(current)
      current, current_bytes = [], 0
    current.append((name, shape))
    current_bytes += size_bytes
  shards.append(current)
  rng = np.random.default_rng(0)
  output_table = 'model.embed_tokens.weight' if config['tie_word_embeddings'] else 'lm_head.weight'
  weight_map, total = {}, 0
  for index, tensors in enumerate(shards):
    file = f'model-{index + 1:05d}-of-{len(shards):05d}.safetensors'
    write_shard(os.path.join(hf_dir, file), tensors, rng, output_table)
    for name, shape in tensors:
      weight_map[name] = file
      total += int(np.prod(shape)) * 2
  with open(os.path.join(hf_dir, 'model.safetensors.index.json'), 'w') as f:
    json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=1)
  return total


def drop_page_cache(folder: str) -> None:
  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_RDONLY)
    try:
      os.fsync(fd)
      os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
      os.close(fd)


def read_rate(hf_dir: str) -> float:
  """Bytes/s of one sequential read of the shards, the page cache dropped first."""
  drop_page_cache(hf_dir)
  files = [os.path.join(hf_dir, n) for n in sorted(os.listdir(hf_dir))
           if n.endswith('.safetensors')]
  start, total = time.perf_counter(), 0
  for path in files:
    with open(path, 'rb', buffering=0) as f:
      while True:
        block = f.read(READ_CHUNK)
        if not block:
          break
        total += len(block)
  return total / (time.perf_counter() - start)


def write_rate(folder: str, size: int = 2 ** 30) -> float:
  """Bytes/s of one sequential write of `size` bytes in 64 MiB writes, fsync included."""
  path = os.path.join(folder, 'write_rate.bin')
  block = np.random.default_rng(0).integers(0, 256, READ_CHUNK, np.uint8).tobytes()
  start = time.perf_counter()
  with open(path, 'wb', buffering=0) as f:
    for _ in range(size // READ_CHUNK):
      f.write(block)
    os.fsync(f.fileno())
  seconds = time.perf_counter() - start
  os.remove(path)
  return size // READ_CHUNK * READ_CHUNK / seconds


PHASES = re.compile(r'read and converted in ([0-9.]+) s .*written in ([0-9.]+) s')


def import_phases(tail: list) -> dict:
  """The import's own line: seconds reading + converting and writing."""
  found = [PHASES.search(line) for line in tail]
  found = [m for m in found if m]
  return ({'read_phase_s': float(found[-1].group(1)), 'write_phase_s': float(found[-1].group(2))}
          if found else {})


def run_child(command: list, limit_bytes: float) -> dict:
  """Runs `command`; wall seconds, exit code, the peak RSS seen (polled) and `ru_maxrss`."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  start = time.perf_counter()
  process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
  polled, stopped = [0], [False]

  def watch():
    while process.poll() is None:
      try:
        with open(f'/proc/{process.pid}/status') as f:
          rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmRSS'))
      except (OSError, StopIteration):
        rss = 0
      polled[0] = max(polled[0], rss)
      if rss > limit_bytes:
        stopped[0] = True
        process.kill()
      time.sleep(0.2)

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  output, _ = process.communicate()
  wall = time.perf_counter() - start
  watcher.join()
  after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  return dict(wall_s=wall, returncode=process.returncode, stopped_at_limit=stopped[0],
              polled_peak_bytes=polled[0],
              maxrss_bytes=after * 1024 if after > before else None,
              tail=output.strip().splitlines()[-3:])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', choices=sorted(SIZES), default='1b')
  parser.add_argument('--dir', default='/tmp/import_scale')
  parser.add_argument('--memory_limit_gib', type=float, default=20.0,
                      help='stop the import above this resident memory')
  parser.add_argument('--decode', action='store_true', help='greedy tokens/s after the import')
  parser.add_argument('--keep', action='store_true', help='keep the checkpoint and the run')
  args = parser.parse_args()
  hf_dir = os.path.join(args.dir, f'hf_{args.size}')
  workdir = os.path.join(args.dir, f'run_{args.size}')
  shutil.rmtree(args.dir, ignore_errors=True)
  start = time.perf_counter()
  total = build_checkpoint(args.size, hf_dir)
  print(json.dumps(dict(size=args.size, checkpoint_bytes=total,
                        parameters=total // 2, build_s=time.perf_counter() - start)), flush=True)
  rate = read_rate(hf_dir)
  written = write_rate(args.dir)
  print(json.dumps(dict(disk_read_bytes_per_s=rate, disk_write_bytes_per_s=written)), flush=True)
  drop_page_cache(hf_dir)
  result = run_child([sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={hf_dir}',
                      f'--workdir={workdir}'], args.memory_limit_gib * 2 ** 30)
  peak = max(result['polled_peak_bytes'], result['maxrss_bytes'] or 0)
  result.update(peak_over_checkpoint=peak / total, read_bytes_per_s=total / result['wall_s'],
                read_over_disk=total / result['wall_s'] / rate, **import_phases(result['tail']))
  if 'read_phase_s' in result:       # the reading alone against the disk's read rate, the
    result.update(                   # writing alone against its write rate
        read_phase_over_disk=total / result['read_phase_s'] / rate,
        write_phase_over_disk_write=total / result['write_phase_s'] / written)
  print(json.dumps(dict(step='import', **result)), flush=True)
  if args.decode and result['returncode'] == 0:
    runs = {}
    for new_tokens in (8, 40):
      runs[new_tokens] = run_child(
          [sys.executable, 'generate.py', f'--workdir={workdir}', '--prompt_ids=1,5,9,13',
           '--temperature=0', f'--max_new_tokens={new_tokens}', '--kv_cache=64'],
          args.memory_limit_gib * 2 ** 30)
      print(json.dumps(dict(step='generate', new_tokens=new_tokens, **runs[new_tokens])),
            flush=True)
    if all(r['returncode'] == 0 for r in runs.values()):
      print(json.dumps(dict(decode_tokens_per_s=32 / (runs[40]['wall_s'] - runs[8]['wall_s']))),
            flush=True)
  if not args.keep:
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == '__main__':
  main()

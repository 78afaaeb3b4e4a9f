"""Tokens per second and model-FLOPs utilisation of a training run.

  python benchmarks/train_throughput.py [--config=configs/default.py] [--steps=60]

Runs train.py's own `train()` on the config for `--steps` steps (checkpoints
and evaluation off, a throw-away workdir). Tokens/s is taken over the second
half of the steps (the first half absorbs compilation). MFU is the model's
training FLOPs per token (`longformer_jax/models/flop_count.py`) times
tokens/s over the float32 matmul rate measured in the same run. The last
line is `tokens_per_s=... mfu=...`.
"""

import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import flags
import jax

from benchmarks.matmul_rate import float32_matmul_flops_per_s
from longformer_jax import command_line
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.decoder_lm import lm_model_config
from longformer_jax.models.flop_count import train_flops_per_token
from longformer_jax.train.quiet_logs import show_own_info_only
import train as train_script

_STEPS = flags.DEFINE_integer('steps', 60, 'Training steps to run (even).')


def main(argv):
  del argv
  show_own_info_only()
  config = command_line.flag_config()
  steps = max(2, _STEPS.value // 2 * 2)
  config.train.update(num_steps=steps, log_every=steps // 2, eval_every=0,
                      checkpoint_every=10 * steps, async_checkpointing=False)
  matmul_rate = float32_matmul_flops_per_s()
  with tempfile.TemporaryDirectory() as workdir:
    _, metrics = train_script.train(config, workdir)
  model_config = lm_model_config(config.model, make_tokenizer(config.data).vocab_size)
  flops_per_token = train_flops_per_token(model_config, config.data.chunk_len,
                                          config.data.batch_size)
  tokens_per_s = metrics['tokens_per_s']
  mfu = flops_per_token * tokens_per_s / matmul_rate
  print(f'backend={jax.default_backend()} devices={jax.device_count()} '
        f'attention={model_config.attention} layers={model_config.num_layers} '
        f'd_model={model_config.d_model} chunk={config.data.chunk_len} '
        f'mem_len={model_config.mem_len} batch={config.data.batch_size}')
  print(f'float32 matmul rate: {matmul_rate / 1e9:.1f} GFLOP/s; '
        f'model: {flops_per_token / 1e6:.2f} MFLOP/token (train); '
        f'achieved {flops_per_token * tokens_per_s / 1e9:.1f} GFLOP/s')
  print(f'tokens_per_s={tokens_per_s:.1f} mfu={mfu:.3f}')


if __name__ == '__main__':
  command_line.define_flags('unused: the run goes to a temporary folder')
  command_line.run(main)

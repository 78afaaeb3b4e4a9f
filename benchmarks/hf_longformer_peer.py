"""Hugging Face's PyTorch LongformerSelfAttention, timed as a peer of ours.

Same shapes as `longformer_layer_two_sided` (benchmarks/longformer_cases.py):
hidden states `[1, n, 512]`, 8 heads of 64, `attention_window = 512` (their
total window = our one-sided 256), random weights, no global tokens,
`torch.set_num_threads(2)`. Forward+backward is the gradient of the output's
sum with respect to the hidden states and every weight. torch and
transformers are optional (not in requirements.txt): `available()` says
whether they import.
"""

import statistics
import time

ATTENTION_WINDOW = 512   # Hugging Face's convention: the total window


def available() -> str:
  """'' when torch and transformers import, else the reason they do not."""
  try:
    import torch  # noqa: F401
    from transformers.models.longformer import modeling_longformer  # noqa: F401
  except Exception as error:  # pylint: disable=broad-except
    return f'{type(error).__name__}: {error}'
  return ''


def time_self_attention(seq_len: int, mode: str, repeats: int = 3, threads: int = 2) -> float:
  """Median seconds of one forward (`mode='fwd'`) or forward+backward (`'fwd_bwd'`)."""
  return statistics.median(self_attention_times(seq_len, mode, repeats, threads))


def self_attention_times(seq_len: int, mode: str, repeats: int = 3, threads: int = 2) -> list:
  """Seconds of each of `repeats` timed runs after one untimed run (see time_self_attention)."""
  import torch
  from transformers import LongformerConfig
  from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

  torch.set_num_threads(threads)
  torch.manual_seed(0)
  config = LongformerConfig(hidden_size=512, num_attention_heads=8,
                            attention_window=[ATTENTION_WINDOW], attention_probs_dropout_prob=0.0)
  layer = LongformerSelfAttention(config, layer_id=0)
  hidden = torch.randn(1, seq_len, 512, requires_grad=(mode == 'fwd_bwd'))
  mask = torch.zeros(1, seq_len)
  none = torch.zeros(1, seq_len, dtype=torch.bool)

  def run():
    if mode == 'fwd':
      with torch.no_grad():
        layer(hidden, attention_mask=mask, is_index_masked=none, is_index_global_attn=none,
              is_global_attn=False)
      return
    out = layer(hidden, attention_mask=mask, is_index_masked=none, is_index_global_attn=none,
                is_global_attn=False)[0]
    out.sum().backward()

  run()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return times

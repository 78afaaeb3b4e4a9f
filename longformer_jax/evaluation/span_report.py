"""Learned attention spans of an Adaptive-Span model: per head and layer, as a table and a plot.

eval.py calls this for runs whose layers use `adaptive_span` attention with
learned (not dynamic) spans: z = S * clip(span_fraction, 0, 1) per head
(longformer_jax/attention/adaptive_span.py).
"""

import flax.linen as nn
import numpy as np

from longformer_jax.attention.adaptive_span import largest_span
from longformer_jax.models.layer_schedule import layer_config
from longformer_jax.models.param_layout import unrolled_layout
from longformer_jax.evaluation.line_plots import save_line_plot


def learned_spans(params, model_config) -> list:
  """`[{'layer': i, 'spans': [z_head0, ...]}, ...]` for the adaptive-span layers with static spans."""
  params = nn.meta.unbox(params)
  blocks = params['blocks']
  if 'layers' in blocks:       # nn.scan layout: one stacked weight per parameter
    blocks = unrolled_layout(params, model_config.num_layers)['blocks']
  rows = []
  for i in range(model_config.num_layers):
    cfg = layer_config(model_config, i)
    if cfg.attention != 'adaptive_span' or cfg.adaptive_span.dynamic:
      continue
    largest = largest_span(cfg)
    fraction = np.asarray(blocks[f'layer_{i}']['attention']['span_fraction'], np.float64)
    rows.append({'layer': i, 'spans': [float(z) for z in largest * np.clip(fraction, 0.0, 1.0)]})
  return rows


def markdown_spans(rows: list) -> str:
  heads = max(len(r['spans']) for r in rows)
  lines = ['| layer | ' + ' | '.join(f'head {h}' for h in range(heads)) + ' | mean |',
           '|---:|' + '---:|' * (heads + 1)]
  for r in rows:
    lines.append(f"| {r['layer']} | " + ' | '.join(f'{z:.1f}' for z in r['spans'])
                 + f" | {np.mean(r['spans']):.1f} |")
  return '\n'.join(lines)


def plot_spans(rows: list, path: str, title: str) -> None:
  """Span per head (x) for each layer (one line per layer)."""
  series = [(list(range(len(r['spans']))), r['spans'], f"layer {r['layer']}") for r in rows]
  save_line_plot(series, path, xlabel='head', ylabel='learned span (tokens)', title=title)
